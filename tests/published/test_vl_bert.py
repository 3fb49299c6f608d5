"""VL-BERT's published ``.model`` files (prec and e2e) convert into vlbert models that compute what VL-BERT's code
computes (tests/helpers/vl_bert_reference.py, written from jackroos/VL-BERT at 4373674), and bad files are refused in one
line."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from helpers.published import ragged_text, write_tokenizer
from helpers.vl_bert_files import OPTIMIZER, write_model_file
from helpers.vl_bert_reference import vl_bert_forward, vl_bert_state

from vlbert.config import VLBertConfig
from vlbert.families import convert_checkpoint
from vlbert.models.vl import VLBertForPreTraining
from vlbert.processing.images import PREPROCESSING, ImagePreprocessing

SIZES = {
    "tiny": dict(hidden=32, layers=2, intermediate=48, vocab=60, feature_dim=24),
    "heads_tiny": 4,
    "base": dict(hidden=768, layers=1, intermediate=3072, vocab=120, feature_dim=2048),
    "heads_base": 12,
}


def write_config(path, precomputed: bool, heads: int):
    """The NETWORK section of a VL-BERT YAML config (cfgs/pretrain/*.yaml)."""
    path.write_text(
        yaml.safe_dump({"NETWORK": {"IMAGE_FEAT_PRECOMPUTED": precomputed, "VLBERT": {"num_attention_heads": heads}}})
    )
    return path


def boxes_in_pixels(batch, regions, wh, seed=0):
    """Pixel boxes with VL-BERT's whole-image box (0, 0, w - 1, h - 1) first, as its datasets add it."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(batch, regions, 2, generator=g) * 0.5
    boxes = torch.cat([xy, xy + 0.4], -1) * wh.repeat(1, 2)[:, None]
    boxes[:, 0] = torch.cat([torch.zeros(batch, 2), wh - 1], 1)
    return boxes


@pytest.fixture(scope="module", params=["tiny", "base"])
def prec(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vl-bert-prec")
    size = request.param
    state = vl_bert_state(**SIZES[size], positions=64)
    source = write_model_file(tmp / "vl-bert-prec.model", state)
    heads = SIZES["heads_" + size]
    report = convert_checkpoint(
        "vl-bert",
        source,
        tmp / "out",
        config=write_config(tmp / "c.yaml", True, heads),
        tokenizer=write_tokenizer(tmp / "tok", SIZES[size]["vocab"], cased=False),
    )
    return state, VLBertForPreTraining.from_pretrained(tmp / "out").eval(), report, heads


def assert_rows_equal(ours, last_hidden, ref, text_length):
    """Per row: text states, object states, MLM and region-class logits against the reference's (real rows)."""
    for i, r in enumerate(ref):
        nt, no = r["text"].shape[0], r["objects"].shape[0]
        objects = last_hidden[i, text_length : text_length + no]
        torch.testing.assert_close(last_hidden[i, :nt], r["text"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(objects, r["objects"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            ours.masked_lm(last_hidden[i, :nt], ours.bert.embeddings.word_embeddings.weight),
            r["mlm"],
            atol=1e-5,
            rtol=1e-5,
        )
        torch.testing.assert_close(ours.mrc(objects), r["mvrc"], atol=1e-5, rtol=1e-5)


def test_prec_checkpoint_equals_its_reference_forward(prec):
    state, ours, report, heads = prec
    assert report["model_class"] == "VLBertForPreTraining" and report["dropped"] == {}
    assert sorted(k for k in report["missing"] if k.startswith("bert.")) == [
        "bert.pooler.dense.bias",
        "bert.pooler.dense.weight",
    ]
    assert ours.config.type_vocab_size == 3 and ours.config.num_region_classes == 1601
    b, r, d = 3, 6, ours.config.region_feature_dim
    ids, tm = ragged_text(b, 9, ours.config.vocab_size, [9, 6, 4])
    wh = torch.tensor([[100.0, 80.0], [64.0, 120.0], [90.0, 90.0]])
    boxes = boxes_in_pixels(b, r, wh)
    feats = torch.randn(b, r, d, generator=torch.Generator().manual_seed(2))
    region_mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4])
    masked = torch.zeros(b, r, dtype=torch.bool)
    masked[0, 2] = masked[1, 1] = True  # MVRC: VL-BERT's mask embeddings replace the feature and [IMG]
    with torch.no_grad():
        ref = vl_bert_forward(state, ids, tm, boxes, wh, region_mask, masked.long(), heads, features=feats)
        out = ours(
            ids,
            attention_mask=tm,
            region_features=feats.masked_fill(masked[..., None], 0.0),
            region_boxes=boxes / wh.repeat(1, 2)[:, None],
            region_mask=region_mask,
            masked_regions=masked,
        )
    assert out.last_hidden_state.shape == (b, 9 + r, ours.config.hidden_size)  # [END] is not an output row
    assert_rows_equal(ours, out.last_hidden_state, ref, 9)


def test_regions_share_one_position_so_their_order_does_not_matter(prec):
    _, ours, _, _ = prec
    if ours.config.hidden_size > 32:
        pytest.skip("a property of the pathway: the tiny model shows it")
    ids, tm = ragged_text(2, 6, 60, [6, 4])
    boxes = boxes_in_pixels(2, 5, torch.tensor([[1.0, 1.0], [1.0, 1.0]]))
    feats = torch.randn(2, 5, 24, generator=torch.Generator().manual_seed(4))
    order = torch.tensor([0, 3, 1, 4, 2])  # the whole-image box stays first: it also feeds every text token
    with torch.no_grad():
        a = ours.bert(ids, attention_mask=tm, region_features=feats, region_boxes=boxes).last_hidden_state
        b = ours.bert(
            ids, attention_mask=tm, region_features=feats[:, order], region_boxes=boxes[:, order]
        ).last_hidden_state
    torch.testing.assert_close(b[:, :6], a[:, :6], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b[:, 6:], a[:, 6:][:, order], atol=1e-5, rtol=1e-5)


def test_e2e_checkpoint_runs_its_backbone_and_equals_its_reference(tmp_path):
    state = vl_bert_state(backbone_layers=[1, 1, 1], positions=64)
    source = write_model_file(tmp_path / "vl-bert-e2e.model", state)
    report = convert_checkpoint(
        "vl-bert",
        source,
        tmp_path / "out",
        config=write_config(tmp_path / "c.yaml", False, 4),
        tokenizer=write_tokenizer(tmp_path / "tok", 60, cased=False),
    )
    ours = VLBertForPreTraining.from_pretrained(tmp_path / "out").eval()
    assert ours.config.visual_backbone["layers"] == [1, 1, 1] and report["dropped"] == {}
    info = json.loads((tmp_path / "out" / "processor.json").read_text())  # pipelines and fine-tuning read its pixels
    assert ImagePreprocessing.from_record(info["image_preprocessing"]) == PREPROCESSING["vl-bert"]
    res5 = [k for k in state if k.startswith("module.image_feature_extractor.roi_head_feature_extractor.")]
    assert sum(k.startswith("bert.visual_backbone.head.") for k in ours.state_dict()) == len(res5)  # one copy kept
    ids, tm = ragged_text(2, 7, 60, [7, 4])
    wh = torch.tensor([[80.0, 64.0], [64.0, 56.0]])
    images = torch.randn(2, 3, 64, 80, generator=torch.Generator().manual_seed(1))
    images[1, :, 56:], images[1, :, :, 64:] = 0.0, 0.0  # the second image padded to the batch's size
    boxes = torch.tensor([[[0, 0, 79, 63], [5, 6, 40, 30]], [[0, 0, 63, 55], [10, 3, 50, 40]]], dtype=torch.float)
    with torch.no_grad():
        ref = vl_bert_forward(state, ids, tm, boxes, wh, torch.ones(2, 2), torch.zeros(2, 2), 4, images=images)
        out = ours(
            ids,
            attention_mask=tm,
            region_boxes=boxes / wh.repeat(1, 2)[:, None],
            images=images,
            image_sizes=wh.flip(-1).long(),
        )
    assert_rows_equal(ours, out.last_hidden_state, ref, 7)


def test_bad_vl_bert_files_are_refused_in_one_line_and_write_nothing(tmp_path):
    from helpers.builders import tool

    from vlbert.commands import run_tool

    convert = tool("convert_checkpoint")
    tok = str(write_tokenizer(tmp_path / "tok", 60, cased=False))
    state = vl_bert_state(layers=1)
    torch.save({"optimizer": OPTIMIZER}, tmp_path / "optimizer.model")
    write_model_file(tmp_path / "prec.model", state)
    e2e = dict(state)
    for name in ("roi_head_feature_extractor.0.conv1.weight", "head.0.0.conv1.weight", "backbone.conv1.weight"):
        e2e["module.image_feature_extractor." + name] = torch.ones(4, 4, 1, 1)
    e2e["module.image_feature_extractor.head.0.0.conv1.weight"] = torch.zeros(4, 4, 1, 1)
    write_model_file(tmp_path / "altered-e2e.model", e2e)
    e2e_config = str(write_config(tmp_path / "e2e.yaml", False, 4))
    cases = {
        "holds only an optimizer state": [str(tmp_path / "optimizer.model")],
        "this is a prec checkpoint .* but the config says e2e": [str(tmp_path / "prec.model"), "--config", e2e_config],
        "the res5 head's two copies differ": [str(tmp_path / "altered-e2e.model")],
        "it is a vl-bert checkpoint: pass --from vl-bert": ["--from", "uniter", str(tmp_path / "prec.model")],
    }
    for message, argv in cases.items():
        out = tmp_path / "never"
        args = [*argv, "--tokenizer", tok, "--output-dir", str(out)]
        args = args if "--from" in args else ["--from", "vl-bert", *args]
        with pytest.raises(ValueError, match=message):
            convert(args)
        assert run_tool(convert, args) == 2
        assert not out.exists()


def test_vl_bert_pathway_keeps_the_model_contract(tmp_path):
    """Pretraining with MLM and masked region classification over VL-BERT's pathway: finite loss, the backward
    reaches every parameter (DDP needs each in every graph), save / load is exact."""
    from helpers.batches import B, D, R, mlm_labels, regions, text

    config = VLBertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=40,
        type_vocab_size=3,
        region_feature_dim=D,
        num_region_classes=4,
        region_embedding="vl-bert",
        region_location_dim=4,
        region_token_type=2,
        region_head_norm=False,
    )
    torch.manual_seed(0)
    model = VLBertForPreTraining(config).train()
    batch = {**(t := text()), **regions(), "labels": mlm_labels(t)}
    masked = torch.zeros(B, R, dtype=torch.bool)
    masked[:, 1] = True
    out = model(**batch, masked_regions=masked, region_labels=torch.full((B, R, 4), 0.25))
    assert torch.isfinite(out.loss) and {"mlm", "mrc_kl"} <= set(out.losses)
    out.loss.backward()
    unused = {id(p) for p in out.unused_parameters or ()}
    assert [n for n, p in model.named_parameters() if p.grad is None and id(p) not in unused] == []
    model.save_pretrained(tmp_path / "m")
    loaded = VLBertForPreTraining.from_pretrained(tmp_path / "m")
    assert not loaded.loading_info.missing_keys and not loaded.loading_info.unexpected_keys
    assert loaded.config.region_embedding == "vl-bert" and not loaded.config.region_head_norm
