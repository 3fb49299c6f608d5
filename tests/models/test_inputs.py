"""The one typed input of the vision-language models (vlbert/models/inputs.py): a forward given a ``VLInputs``
computes what it computes from the same fields as keywords; fields are read by name, so two fields of one shape
cannot trade places; image pairs are laid out in one place; and the datasets make their items through the
processor's rules (one home for truncation and the region limit)."""

from __future__ import annotations

import pytest
import torch
from helpers.builders import padded_batch, random_hf_config
from vlbert.detectors.regions import Regions

import vlbert
from vlbert.data.vqa import VQADataset, VQAExample
from vlbert.models.inputs import VLInputs
from vlbert.models.vl_classification import VLBertForImagePairClassification
from vlbert.processing import VLProcessor


def _config(**kw):
    values = random_hf_config(0).to_dict()
    values.update(region_feature_dim=12, num_region_classes=0, **kw)
    return vlbert.VLBertConfig.from_dict(values)


def _inputs(batch=3, regions=4):
    ids, types, mask = padded_batch(_config().vocab_size, batch=batch, seed=1)
    g = torch.Generator().manual_seed(2)
    boxes = torch.rand(batch, regions, 2, generator=g) * 0.5
    return VLInputs(
        input_ids=ids,
        token_type_ids=types,
        attention_mask=mask,
        region_features=torch.randn(batch, regions, 12, generator=g),
        region_boxes=torch.cat([boxes, boxes + 0.4], -1),
        region_mask=torch.ones(batch, regions, dtype=torch.long),
        region_token_type_ids=torch.ones(batch, regions, dtype=torch.long),
    )


def test_a_vlinputs_and_its_fields_as_keywords_encode_alike():
    torch.manual_seed(0)
    model = vlbert.VLBertModel(_config()).eval()
    inputs = _inputs()
    with torch.no_grad():
        typed = model(inputs).last_hidden_state
        keywords = model(**vars(inputs)).last_hidden_state
    torch.testing.assert_close(typed, keywords, rtol=0, atol=0)


def test_fields_are_read_by_name_not_by_position():
    """region_mask and region_token_type_ids are both int64 [B, R] (here the types all 1): a region the mask hides
    changes nothing of the text's states whatever its features, so the model reads the mask as the mask (one that
    took the types' all-ones in its place would let the hidden region's features in)."""
    torch.manual_seed(0)
    model = vlbert.VLBertModel(_config()).eval()
    inputs = _inputs()
    inputs.region_mask[:, 2:] = 0
    other = inputs.region_features.clone()
    other[:, 2:] = torch.randn_like(other[:, 2:])
    t = inputs.input_ids.shape[1]
    with torch.no_grad():
        text = model(inputs).last_hidden_state[:, :t]
        again = model(inputs.replace(region_features=other)).last_hidden_state[:, :t]
    real = inputs.attention_mask.bool()
    torch.testing.assert_close(text[real], again[real], rtol=0, atol=1e-5)


def test_a_typed_input_with_keyword_fields_or_an_unknown_keyword_is_refused():
    model = vlbert.VLBertModel(_config()).eval()
    inputs = _inputs()
    with pytest.raises(TypeError, match="one VLInputs or as keywords, not both"):
        model(inputs, region_mask=inputs.region_mask)
    with pytest.raises(TypeError, match=r"takes the fields of VLInputs; got \['region_maks'\]"):
        model(**vars(inputs.replace(region_mask=None)), region_maks=inputs.region_mask)
    with pytest.raises(TypeError, match="input_ids given twice"):
        model(inputs.input_ids, input_ids=inputs.input_ids)
    with pytest.raises(TypeError, match=r"not dict; pass a batch dict as keywords: model\(\*\*batch\)"):
        model(vars(inputs))


def test_image_pairs_as_rows_and_joined():
    inputs = _inputs(batch=2, regions=3)
    pairs = VLInputs(
        input_ids=inputs.input_ids,
        attention_mask=inputs.attention_mask,
        region_features=torch.arange(2 * 2 * 3 * 12, dtype=torch.float32).view(2, 2, 3, 12),
        region_boxes=torch.rand(2, 2, 3, 4),
        region_mask=torch.ones(2, 2, 3, dtype=torch.long),
    )
    rows = pairs.image_pairs((1, 2), joined=False)
    assert rows.input_ids.shape[0] == 4 and torch.equal(rows.input_ids[2], inputs.input_ids[1])
    assert torch.equal(rows.region_features[3], pairs.region_features[1, 1])  # statement 1 with its right image
    assert rows.region_token_type_ids.tolist() == [[1] * 3, [2] * 3] * 2
    joined = pairs.image_pairs((0, 1), joined=True)
    assert torch.equal(joined.input_ids, inputs.input_ids) and joined.layout is None
    assert torch.equal(joined.region_features[1, 3:], pairs.region_features[1, 1])
    assert joined.region_token_type_ids.tolist() == [[0, 0, 0, 1, 1, 1]] * 2
    with pytest.raises(ValueError, match=r"\[batch, 2, regions, dim\]"):
        inputs.image_pairs(None, joined=False)
    model = VLBertForImagePairClassification(_config(num_labels=2)).eval()
    with torch.no_grad():
        assert model(pairs).logits.shape == (2, 2)


def test_datasets_take_their_items_through_the_processors_rules(tokenizer):
    """The processor's max_text_length and max_regions decide every item a dataset makes: no dataset has its own
    copy of the rule (processing/processor.py: text_ids and region_item)."""
    regions = {
        "a": Regions("a", 10, 10, [[0, 0, 5, 5]] * 9, torch.randn(9, 12).numpy(), [1.0] * 9),
    }
    question = "is the very long question about the shape and the colour of the thing in this image answered"
    examples = [VQAExample("q1", "a", question, ("red",) * 3)]
    for max_text_length, max_regions in ((8, 4), (12, 9)):
        processor = VLProcessor(tokenizer, max_text_length=max_text_length, max_regions=max_regions)
        item = VQADataset(examples, regions, processor, ["red"])[0]
        assert item["input_ids"] == processor.text_ids([question])[0] and len(item["input_ids"]) == max_text_length
        assert len(item["region_features"]) == min(9, max_regions)
