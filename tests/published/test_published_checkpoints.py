"""Published vision-language checkpoints (UNITER, VisualBERT, Oscar/VinVL) convert into vlbert models that compute
what their own code computes: VisualBERT against transformers' models with the same weights; UNITER and Oscar/VinVL
against reference forwards written from their code's equations (tests/helpers/published_references.py)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers.published import (
    UNITER_CONFIG,
    VB_SIZES,
    perturb_,
    ragged_regions,
    ragged_text,
    write_tokenizer,
    write_uniter,
)
from helpers.published_references import (
    oscar_forward,
    uniter_forward,
    uniter_heads,
    uniter_nlvr2_paired_attn,
    uniter_state,
)

from vlbert.families import convert_checkpoint
from vlbert.inference import ImagePairPipeline
from vlbert.models.region_embeddings import region_location_features
from vlbert.models.retrieval import VLBertForImageTextRetrieval
from vlbert.models.uniter_heads import VLBertForNLVR2Paired, VLBertForNLVR2PairedAttention, VLBertForVisualEntailment
from vlbert.models.vl import VLBertForPreTraining, VLBertModel
from vlbert.models.vl_classification import VLBertForVisualReasoning
from vlbert.models.vqa import VLBertForMaskedTokenVQA, VLBertForVQA

# ------------------------------------------------------------------------------------------------------ VisualBERT


def visualbert(cls, size, tmp_path, **extra):
    config = transformers.VisualBertConfig(
        **VB_SIZES[size], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **extra
    )
    torch.manual_seed(0)
    hf = cls(config).eval()
    perturb_(hf)
    source = tmp_path / "hf"
    hf.save_pretrained(source)
    tok = write_tokenizer(tmp_path / "tok", config.vocab_size, cased=False)
    return hf, source, tok


def visualbert_inputs(hf, visual_types):
    cfg = hf.config
    ids, text_mask = ragged_text(3, 9, cfg.vocab_size, [9, 6, 4])
    feats, boxes, region_mask = ragged_regions(3, 5, cfg.visual_embedding_dim, [5, 3, 2])
    types = torch.zeros_like(region_mask) if visual_types == "zeros" else torch.randint(0, 2, region_mask.shape)
    token_types = torch.zeros_like(ids)
    return ids, token_types, text_mask, feats, boxes, region_mask, types


def valid_rows(hidden, text_mask, region_mask):
    """The hidden states at real positions only (padded positions carry values nothing reads)."""
    return hidden[torch.cat([text_mask, region_mask], 1).bool()]


@pytest.mark.parametrize("size", ["small", "base"])
def test_visualbert_model_equals_transformers(tmp_path, size):
    hf, source, tok = visualbert(transformers.VisualBertModel, size, tmp_path)
    report = convert_checkpoint("visualbert", source, tmp_path / "out", tokenizer=tok)
    ours = VLBertModel.from_pretrained(tmp_path / "out").eval()
    assert report["task"] == "vl-pretraining" and ours.config.region_embedding == "visualbert"
    for visual_types in ("zeros", "random"):
        ids, tt, tm, feats, boxes, rm, types = visualbert_inputs(hf, visual_types)
        with torch.no_grad():
            ref = hf(
                input_ids=ids,
                token_type_ids=tt,
                attention_mask=tm,
                visual_embeds=feats,
                visual_attention_mask=rm,
                visual_token_type_ids=types,
            )
            out = ours(
                ids,
                token_type_ids=tt,
                attention_mask=tm,
                region_features=feats,
                region_mask=rm,
                region_token_type_ids=types,
            )
        torch.testing.assert_close(
            valid_rows(out.last_hidden_state, tm, rm), valid_rows(ref.last_hidden_state, tm, rm), atol=1e-5, rtol=1e-5
        )
        torch.testing.assert_close(out.pooler_output, ref.pooler_output, atol=1e-5, rtol=1e-5)


def test_visualbert_pretraining_heads_equal_transformers(tmp_path):
    hf, source, tok = visualbert(transformers.VisualBertForPreTraining, "small", tmp_path)
    convert_checkpoint("visualbert", source, tmp_path / "out", tokenizer=tok)
    ours = VLBertForPreTraining.from_pretrained(tmp_path / "out").eval()
    ids, tt, tm, feats, boxes, rm, types = visualbert_inputs(hf, "zeros")
    with torch.no_grad():
        ref = hf(
            input_ids=ids,
            token_type_ids=tt,
            attention_mask=tm,
            visual_embeds=feats,
            visual_attention_mask=rm,
            visual_token_type_ids=types,
        )
        out = ours(
            ids, token_type_ids=tt, attention_mask=tm, region_features=feats, region_boxes=boxes, region_mask=rm
        )  # the converted config's default region type is 0
        itm = ours.itm(out.pooler_output)
    t = ids.shape[1]
    torch.testing.assert_close(
        out.prediction_logits[tm.bool()], ref.prediction_logits[:, :t][tm.bool()], atol=1e-5, rtol=1e-5
    )
    # VisualBERT's sentence-image head says 0 = the caption matches; our ITM head says 1 = match.
    torch.testing.assert_close(itm, ref.seq_relationship_logits.flip(-1), atol=1e-5, rtol=1e-5)


def test_visualbert_vqa_head_reads_the_mask_position(tmp_path):
    hf, source, tok = visualbert(transformers.VisualBertForQuestionAnswering, "small", tmp_path, num_labels=7)
    answers = [f"answer-{i}" for i in range(7)]
    convert_checkpoint("visualbert", source, tmp_path / "out", tokenizer=tok, labels=answers)
    ours = VLBertForMaskedTokenVQA.from_pretrained(tmp_path / "out").eval()
    ids, tt, tm, feats, boxes, rm, types = visualbert_inputs(hf, "zeros")
    with torch.no_grad():
        ref = hf(
            input_ids=ids,
            token_type_ids=tt,
            attention_mask=tm,
            visual_embeds=feats,
            visual_attention_mask=rm,
            visual_token_type_ids=types,
        ).logits
        out = ours(
            ids,
            token_type_ids=tt,
            attention_mask=tm,
            region_features=feats,
            region_boxes=boxes,
            region_mask=rm,
            region_token_type_ids=types,
        ).logits
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    info = json.loads((tmp_path / "out" / "processor.json").read_text())
    assert info["task"] == "vqa" and info["labels"] == answers and info["detector"]["fingerprint"] is None


def test_visualbert_nlvr2_head_types_the_two_images(tmp_path):
    hf, source, tok = visualbert(transformers.VisualBertForVisualReasoning, "small", tmp_path, num_labels=2)
    convert_checkpoint("visualbert", source, tmp_path / "out", tokenizer=tok)
    ours = VLBertForVisualReasoning.from_pretrained(tmp_path / "out").eval()
    ids, tt, tm, _, _, _, _ = visualbert_inputs(hf, "zeros")
    feats, boxes, rm = ragged_regions(3, 4, hf.config.visual_embedding_dim, [4, 2, 3], seed=5)
    pair = (torch.stack([feats, feats.flip(1)], 1), torch.stack([boxes, boxes], 1), torch.stack([rm, rm], 1))
    with torch.no_grad():  # transformers: both images' regions in one sequence, typed 0 (left) and 1 (right)
        ref = hf(
            input_ids=ids,
            token_type_ids=tt,
            attention_mask=tm,
            visual_embeds=pair[0].flatten(1, 2),
            visual_attention_mask=pair[2].flatten(1, 2),
            visual_token_type_ids=torch.tensor([0] * 4 + [1] * 4).expand(3, -1),
        ).logits
        features, boxes, region_mask = pair
        out = ours(
            ids,
            token_type_ids=tt,
            attention_mask=tm,
            region_features=features,
            region_boxes=boxes,
            region_mask=region_mask,
        ).logits
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------- UNITER


@pytest.fixture(scope="module")
def uniter_converted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uniter")
    state, path = write_uniter(tmp)
    tok = write_tokenizer(tmp / "tok", 60, cased=True)
    report = convert_checkpoint("uniter", path, tmp / "out", tokenizer=tok, config=tmp / "uniter-tiny.json")
    return state, tmp / "out", report


@pytest.mark.parametrize("counts", [[10, 10, 10], [100, 37, 10]])
def test_uniter_equals_its_reference_forward(uniter_converted, counts):
    state, out_dir, report = uniter_converted
    assert state["uniter.embeddings.word_embeddings.weight"].dtype == torch.float16  # stored as published
    assert report["model_class"] == "VLBertForPreTraining" and not report["missing"]
    ours = VLBertForPreTraining.from_pretrained(out_dir).eval()
    assert ours.config.num_region_classes == 1601 and ours.config.vocab_size == 60
    ids, tm = ragged_text(3, 11, 60, [11, 7, 3])
    feats, boxes, rm = ragged_regions(3, max(counts), 24, counts)
    lengths = tm.sum(1).tolist()
    with torch.no_grad():
        seq, pooled = uniter_forward(state, ids, lengths, feats, region_location_features(boxes), counts, 2, 4)
        out = ours(ids, attention_mask=tm, region_features=feats, region_boxes=boxes, region_mask=rm)
        hidden = out.last_hidden_state
    t = ids.shape[1]
    for row, (tl, nb) in enumerate(zip(lengths, counts, strict=True)):
        torch.testing.assert_close(hidden[row, :tl], seq[row, :tl], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(hidden[row, t : t + nb], seq[row, tl : tl + nb], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.pooler_output, pooled, atol=1e-5, rtol=1e-5)
    ref = uniter_heads(state, seq[0, : lengths[0]], seq[1, lengths[1] : lengths[1] + counts[1]], pooled)
    with torch.no_grad():
        torch.testing.assert_close(out.prediction_logits[0, : lengths[0]], ref["mlm"], atol=1e-5, rtol=1e-5)
        regions = hidden[1, t : t + counts[1]]
        torch.testing.assert_close(ours.mrfr(regions), ref["mrfr"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.mrc(regions), ref["mrc"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.itm(out.pooler_output), ref["itm"], atol=1e-5, rtol=1e-5)


def test_uniter_mask_embedding_is_added_to_masked_regions(uniter_converted):
    """MRM: a masked region's feature is zeroed (UNITER's data/mrm.py zeroes it in the dataset; vlbert's model zeroes
    it on the device, the features travelling once) and mask_embedding[1] added (row 0, unmasked, is zero)."""
    state, out_dir, _ = uniter_converted
    ours = VLBertModel.from_pretrained(out_dir).eval()
    ids, tm = ragged_text(2, 5, 60, [5, 4])
    feats, boxes, rm = ragged_regions(2, 6, 24, [6, 6])
    masked = torch.zeros(2, 6, dtype=torch.bool)
    masked[:, 1] = True
    shifted = feats.clone()
    shifted[:, 1] = state["uniter.img_embeddings.mask_embedding.weight"][1].float()
    with torch.no_grad():
        a = ours(
            ids, attention_mask=tm, region_features=feats, region_boxes=boxes, region_mask=rm, masked_regions=masked
        ).last_hidden_state
        b = ours(ids, attention_mask=tm, region_features=shifted, region_boxes=boxes, region_mask=rm).last_hidden_state
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_uniter_vqa_checkpoint_answers_with_its_labels(tmp_path):
    state, path = write_uniter(tmp_path, "vqa.pt", answers=9)
    tok = write_tokenizer(tmp_path / "tok", 60, cased=True)
    (tmp_path / "ans2label.json").write_text(json.dumps({f"ans{i}": i for i in range(9)}))
    convert_checkpoint(
        "uniter",
        path,
        tmp_path / "out",
        tokenizer=tok,
        labels=tmp_path / "ans2label.json",
        config=tmp_path / "uniter-tiny.json",
    )
    ours = VLBertForVQA.from_pretrained(tmp_path / "out").eval()
    ids, tm = ragged_text(2, 7, 60, [7, 5])
    feats, boxes, rm = ragged_regions(2, 12, 24, [12, 10])
    with torch.no_grad():
        _, pooled = uniter_forward(state, ids, [7, 5], feats, region_location_features(boxes), [12, 10], 2, 4)
        torch.testing.assert_close(
            ours(ids, attention_mask=tm, region_features=feats, region_boxes=boxes, region_mask=rm).logits,
            uniter_heads(state, None, None, pooled)["vqa"],
            atol=1e-5,
            rtol=1e-5,
        )
    info = json.loads((tmp_path / "out" / "processor.json").read_text())
    assert info["labels"] == [f"ans{i}" for i in range(9)]
    assert info["detector"]["extractor"].startswith("detectron2:butd-vg") and info["max_regions"] == 100


@pytest.fixture(scope="module")
def uniter_fine_tuned(tmp_path_factory):
    """UNITER's SNLI-VE, retrieval and NLVR2 paired / paired-attn checkpoints (tiny, float16, its key names), each
    converted once: name -> (its state, the converted directory, the converter's report)."""
    tmp = tmp_path_factory.mktemp("uniter-heads")
    tok = write_tokenizer(tmp / "tok", 60, cased=True)
    out = {}
    for name, kwargs in {
        "ve": {"answers": 3},
        "itm": {"head": "itm"},
        "paired": {"head": "paired"},
        "paired-attn": {"head": "paired-attn"},
    }.items():
        state, path = write_uniter(tmp, f"{name}.pt", seed=len(out) + 1, **kwargs)
        report = convert_checkpoint("uniter", path, tmp / name, tokenizer=tok, config=tmp / "uniter-tiny.json")
        out[name] = state, tmp / name, report
    return out


@pytest.mark.parametrize("regions", [10, 100])
def test_uniter_entailment_and_retrieval_heads_equal_their_reference(uniter_fine_tuned, regions):
    counts = [regions, max(10, regions * 3 // 8), 10]
    ids, tm = ragged_text(3, 9, 60, [9, 6, 3])
    feats, boxes, rm = ragged_regions(3, regions, 24, counts)
    pos7 = region_location_features(boxes)
    state, out_dir, report = uniter_fine_tuned["ve"]
    assert (report["model_class"], report["task"], report["missing"]) == ("VLBertForVisualEntailment", "snli-ve", [])
    info = json.loads((out_dir / "processor.json").read_text())
    assert info["labels"] == ["contradiction", "entailment", "neutral"]  # UNITER's VE_IDX2ENT
    ve = VLBertForVisualEntailment.from_pretrained(out_dir).eval()
    with torch.no_grad():
        _, pooled = uniter_forward(state, ids, [9, 6, 3], feats, pos7, counts, 2, 4)
        torch.testing.assert_close(
            ve(ids, attention_mask=tm, region_features=feats, region_boxes=boxes, region_mask=rm).logits,
            uniter_heads(state, None, None, pooled)["vqa"],
            atol=1e-5,
            rtol=1e-5,
        )

    state, out_dir, report = uniter_fine_tuned["itm"]
    assert (report["model_class"], report["task"]) == ("VLBertForImageTextRetrieval", "retrieval")
    assert sorted(report["dropped"]) == ["itm_output.bias", "itm_output.weight"]
    assert json.loads((out_dir / "processor.json").read_text())["shortlist"] >= 10**9  # re-rank every candidate
    retrieval = VLBertForImageTextRetrieval.from_pretrained(out_dir).eval()
    with torch.no_grad():
        _, pooled = uniter_forward(state, ids, [9, 6, 3], feats, pos7, counts, 2, 4)
        torch.testing.assert_close(
            retrieval(ids, attention_mask=tm, region_features=feats, region_boxes=boxes, region_mask=rm).scores,
            uniter_heads(state, None, None, pooled)["rank"],
            atol=1e-5,
            rtol=1e-5,
        )


@pytest.mark.parametrize("regions", [10, 100])
@pytest.mark.parametrize("head", ["paired", "paired-attn"])
def test_uniter_nlvr2_heads_equal_their_reference(uniter_fine_tuned, head, regions):
    state, out_dir, report = uniter_fine_tuned[head]
    cls = VLBertForNLVR2PairedAttention if head == "paired-attn" else VLBertForNLVR2Paired
    assert report["model_class"] == cls.__name__ and report["task"] == "nlvr2" and not report["missing"]
    ours = cls.from_pretrained(out_dir).eval()
    assert ours.config.type_vocab_size == 3
    assert ImagePairPipeline(out_dir, device="cpu").architecture() is cls  # the NLVR2 pipeline answers with it
    counts = [[regions, max(10, regions // 3)], [10, regions]]  # per pair: left, right
    ids, tm = ragged_text(2, 8, 60, [8, 5])
    feats, boxes, rm = ragged_regions(4, regions, 24, [c for pair in counts for c in pair], seed=3)

    def pairs(t):
        return t.view(2, 2, *t.shape[1:])

    lengths = [8, 8, 5, 5]
    with torch.no_grad():  # UNITER's batch: rows (pair 0 left, pair 0 right, pair 1 left, ...), images typed 1, 2
        seq, pooled, attn = uniter_forward(
            state,
            ids.repeat_interleave(2, 0),
            lengths,
            feats,
            region_location_features(boxes),
            [c for p in counts for c in p],
            2,
            4,
            img_types=[1, 2, 1, 2],
            return_mask=True,
        )
        ref = (
            uniter_nlvr2_paired_attn(state, seq, attn, 4)
            if head == "paired-attn"
            else uniter_heads(state, None, None, pooled)["nlvr2"]
        )
        torch.testing.assert_close(
            ours(
                ids, attention_mask=tm, region_features=pairs(feats), region_boxes=pairs(boxes), region_mask=pairs(rm)
            ).logits,
            ref,
            atol=1e-5,
            rtol=1e-5,
        )


# ----------------------------------------------------------------------------------------------------- Oscar/VinVL
@pytest.mark.parametrize("vinvl", [False, True])
def test_oscar_and_vinvl_equal_their_reference(tmp_path, vinvl):
    hf_config = transformers.BertConfig(
        vocab_size=80,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=40,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    bert = transformers.BertForPreTraining(hf_config)
    perturb_(bert)
    state = {k: v for k, v in bert.state_dict().items() if not k.endswith("position_ids")}
    g = torch.Generator().manual_seed(3)
    state["bert.img_embedding.weight"] = torch.randn(32, 30, generator=g) * 0.2
    state["bert.img_embedding.bias"] = torch.randn(32, generator=g) * 0.1
    config = {
        **hf_config.to_dict(),
        "img_feature_dim": 30,
        "use_img_layernorm": int(vinvl),
        "img_layer_norm_eps": 1e-12,
    }
    if vinvl:
        state["bert.LayerNorm.weight"] = 1 + torch.randn(32, generator=g) * 0.1
        state["bert.LayerNorm.bias"] = torch.randn(32, generator=g) * 0.1
    source = tmp_path / "oscar"
    source.mkdir()
    torch.save(state, source / "pytorch_model.bin")
    (source / "config.json").write_text(json.dumps(config))
    convert_checkpoint("oscar", source, tmp_path / "out", tokenizer=write_tokenizer(tmp_path / "tok", 80, cased=False))
    ours = VLBertModel.from_pretrained(tmp_path / "out").eval()
    assert ours.config.region_embedding == ("vinvl" if vinvl else "oscar") and ours.config.region_feature_dim == 24
    ids, tm = ragged_text(3, 8, 80, [8, 5, 2])
    tt = torch.zeros_like(ids)
    feats, boxes, rm = ragged_regions(3, 6, 24, [6, 4, 1])
    with torch.no_grad():
        seq, pooled = oscar_forward(
            state, config, ids, tt, tm, torch.cat([feats, region_location_features(boxes, 6)], -1), rm
        )
        out = ours(ids, token_type_ids=tt, attention_mask=tm, region_features=feats, region_boxes=boxes, region_mask=rm)
    torch.testing.assert_close(valid_rows(out.last_hidden_state, tm, rm), valid_rows(seq, tm, rm), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.pooler_output, pooled, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------------ bad inputs
class RunsCode:
    def __reduce__(self):
        return (print, ("this pickle runs code",))


def test_bad_checkpoints_are_refused_in_one_line_and_write_nothing(tmp_path):
    from helpers.builders import tool

    convert = tool("convert_checkpoint")
    _, path = write_uniter(tmp_path)
    cased = write_tokenizer(tmp_path / "cased", 60, cased=True)
    uncased = write_tokenizer(tmp_path / "uncased", 60, cased=False)
    config = str(tmp_path / "uniter-tiny.json")
    visualbert_file = tmp_path / "visualbert.pt"
    torch.save({"visual_bert.embeddings.word_embeddings.weight": torch.zeros(60, 32)}, visualbert_file)
    partial = {k: v for k, v in uniter_state().items() if "layer.1.output.dense" not in k}
    torch.save(partial, tmp_path / "partial.pt")
    torch.save({"weights": RunsCode()}, tmp_path / "code.pt")
    triplet = uniter_state(head="paired")
    triplet["nlvr2_output.weight"] = triplet["nlvr2_output.weight"][:, :32]  # UniterForNlvr2Triplet: Linear(H, 2)
    torch.save(triplet, tmp_path / "triplet.pt")
    cases = {
        "lower-cases text": [str(path), "--tokenizer", str(uncased)],
        "it is a visualbert checkpoint": [str(visualbert_file), "--tokenizer", str(cased)],
        "encoder tensors missing": [str(tmp_path / "partial.pt"), "--tokenizer", str(cased)],
        "never unpickles code": [str(tmp_path / "code.pt"), "--tokenizer", str(cased)],
        "NLVR2 'triplet' head": [str(tmp_path / "triplet.pt"), "--tokenizer", str(cased)],
    }
    from vlbert.commands import run_tool

    for message, argv in cases.items():
        out = tmp_path / "never"
        with pytest.raises(ValueError, match=message):
            convert(["--from", "uniter", *argv, "--config", config, "--output-dir", str(out)])
        assert run_tool(convert, ["--from", "uniter", *argv, "--config", config, "--output-dir", str(out)]) == 2
        assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".never")]  # no half-written directory


def test_uniter_2020_itm_names_load(tmp_path):
    """The first uniter-base.pt (before 2020-08-06) named its ITM head ``ITM.*`` (ChenRocks/UNITER issue #5)."""
    state = uniter_state()
    old = {("ITM." + k[len("itm_output.") :] if k.startswith("itm_output.") else k): v for k, v in state.items()}
    torch.save(old, tmp_path / "old.pt")
    (tmp_path / "cfg.json").write_text(json.dumps(UNITER_CONFIG))
    convert_checkpoint(
        "uniter",
        tmp_path / "old.pt",
        tmp_path / "out",
        config=tmp_path / "cfg.json",
        tokenizer=write_tokenizer(tmp_path / "tok", 60, cased=True),
    )
    model = VLBertForPreTraining.from_pretrained(tmp_path / "out")
    torch.testing.assert_close(model.itm.weight, state["itm_output.weight"].float(), rtol=0, atol=0)


def test_uniter_paired_head_needs_a_token_type_for_the_right_image():
    from vlbert.config import VLBertConfig

    config = VLBertConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=48,
        region_feature_dim=24,
        type_vocab_size=2,
        num_labels=2,
    )
    with pytest.raises(ValueError, match="set type_vocab_size to 3"):
        VLBertForNLVR2Paired(config)
