"""The unpadded layout as one typed batch entry (issue 51): it survives the loader (worker processes pickle it), moves
with the batch to the device like a tensor, and a model given it computes what the model reading the mask computes."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import vlbert
from vlbert.layers.unpadded import StreamLayouts, UnpaddedLayout, stream_layouts, unpadded_layout
from vlbert.training.feed import DeviceFeed


def _masks():
    text = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    regions = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    return text, regions


def test_the_layout_is_the_masks_real_positions():
    """indices and cu_seqlens are those of the concatenated mask, row by row (the reference: the mask itself)."""
    text, regions = _masks()
    layout = unpadded_layout(text, regions)
    joint = torch.cat([text, regions], 1)
    assert layout.indices.tolist() == [i for i, m in enumerate(joint.flatten().tolist()) if m]
    assert layout.cu_seqlens.tolist() == [0, 5, 11, 16]
    streams = stream_layouts(text, regions)
    assert streams.text.cu_seqlens.tolist() == [0, 3, 8, 10] and streams.regions.cu_seqlens.tolist() == [0, 2, 3, 6]
    unpadded = layout.unpadding(joint)
    x = torch.randn(*joint.shape, 4)
    assert torch.equal(unpadded.pad(unpadded.unpad(x)), x * joint[..., None])
    with pytest.raises(ValueError, match="with unpadded_layout"):
        layout.unpadding(joint[:2])
    with pytest.raises(ValueError, match="batch sizes"):
        unpadded_layout(text, regions[:2])


def _batch(i):
    text, regions = _masks()
    return {"attention_mask": text, "layout": unpadded_layout(text), "streams": stream_layouts(text, regions)}


def test_the_layout_travels_through_worker_processes_and_the_device_feed():
    """A loader worker pickles the batch to the main process; the feed moves the layout with the tensors."""
    loader = DataLoader(range(2), batch_size=None, collate_fn=_batch, num_workers=1)
    batch = next(iter(loader))
    assert isinstance(batch["layout"], UnpaddedLayout) and isinstance(batch["streams"], StreamLayouts)
    feed = DeviceFeed(torch.device("cpu"))
    moved = feed.receive(feed.send(batch))
    assert torch.equal(moved["layout"].indices, _batch(0)["layout"].indices)
    assert torch.equal(moved["streams"].regions.cu_seqlens, _batch(0)["streams"].regions.cu_seqlens)


@pytest.mark.parametrize("encoder", ["single-stream", "two-stream"])
def test_a_model_given_the_layout_equals_the_model_reading_the_mask(encoder):
    """float64, eval: the collator's layout (joint, or one per stream) gives the hidden states of the mask's."""
    text, regions = _masks()
    streams = {"encoder": encoder, "l_layers": 1, "r_layers": 1, "x_layers": 1} if encoder == "two-stream" else {}
    config = vlbert.VLBertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        region_feature_dim=8,
        **streams,
    )
    torch.manual_seed(0)
    model = vlbert.VLBertModel(config).double().eval()
    g = torch.Generator().manual_seed(0)
    inputs = dict(
        input_ids=torch.randint(1, 50, text.shape, generator=g),
        attention_mask=text,
        region_features=torch.randn(3, 3, 8, generator=g, dtype=torch.float64),
        region_boxes=torch.rand(3, 3, 4, generator=g, dtype=torch.float64),
        region_mask=regions,
    )
    layout = stream_layouts(text, regions) if encoder == "two-stream" else unpadded_layout(text, regions)
    real = torch.cat([text, regions], 1).bool()
    with torch.no_grad():
        reference = model(**inputs).last_hidden_state
        given = model(**inputs, layout=layout).last_hidden_state
    torch.testing.assert_close(given[real], reference[real], atol=1e-12, rtol=0)


def test_the_keys_of_before_issue_51_still_give_the_same_step():
    """../shared/gpu/roofline.py builds its batch with ``MaskingCollator(packed=True)`` and
    ``vlbert.layers.attention.packing_fields`` (the two loose keys of before the layout was one argument): a
    pretraining forward given those computes exactly what it computes given ``layout``; both at once is refused."""
    from vlbert.layers.attention import packing_fields

    torch.manual_seed(0)
    config = vlbert.BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    model = vlbert.BertForPreTraining(config).eval()
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    ids = torch.randint(5, 40, (2, 5)) * mask
    labels = torch.full_like(ids, -100)
    labels[:, 1] = ids[:, 1]
    typed = model(ids, attention_mask=mask, labels=labels, layout=unpadded_layout(mask))
    legacy = model(ids, attention_mask=mask, labels=labels, **packing_fields(mask))
    assert torch.equal(typed.loss, legacy.loss) and torch.equal(typed.prediction_logits, legacy.prediction_logits)
    with pytest.raises(ValueError, match="one argument"):
        model(ids, attention_mask=mask, labels=labels, layout=unpadded_layout(mask), **packing_fields(mask))
