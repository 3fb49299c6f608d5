"""LXMERT, the two-stream model (issue 42): converted from transformers' Lxmert checkpoints through
``tools/convert_checkpoint.py --from lxmert``, it computes what transformers computes (random weights, ragged
text and region counts, float32, 1e-5); airsplay/lxmert's ``module.``-prefixed ``.pth`` layout loads to the same
model; the two-stream encoder keeps the single-stream encoder's shape and unpadding contracts."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers.builders import tool
from helpers.lxmert import LXMERT_SIZES as SIZES
from helpers.published import perturb_, ragged_regions, ragged_text, write_tokenizer

from vlbert.config import VLBertConfig
from vlbert.models.vl import VLBertForPreTraining, VLBertModel
from vlbert.models.vqa import VLBertForVQA

ANSWERS = [f"answer-{i}" for i in range(7)]


def lxmert(cls, size, tmp, **extra):
    """A transformers Lxmert model of ``cls`` with random weights (every parameter perturbed), saved with
    save_pretrained, and a tokenizer of its vocabulary size."""
    config = transformers.LxmertConfig(
        **SIZES[size], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **extra
    )
    torch.manual_seed(0)
    hf = cls(config).eval()
    perturb_(hf)
    hf.save_pretrained(tmp / "hf")
    return hf, tmp / "hf", write_tokenizer(tmp / "tok", config.vocab_size, cased=False)


def inputs(cfg, seed=0):
    """Ragged text (9, 6, 3 real of 9) and regions (5, 2, 4 real of 5), boxes normalised xyxy."""
    ids, tm = ragged_text(3, 9, cfg.vocab_size, [9, 6, 3], seed=seed + 1)
    feats, boxes, rm = ragged_regions(3, 5, cfg.visual_feat_dim, [5, 2, 4], seed=seed)
    return ids, torch.randint(0, 2, ids.shape, generator=torch.Generator().manual_seed(seed)) * tm, tm, feats, boxes, rm


def reference(hf, ids, tt, tm, feats, boxes, rm, **kwargs):
    with torch.no_grad():
        return hf(
            input_ids=ids,
            token_type_ids=tt,
            attention_mask=tm,
            visual_feats=feats,
            visual_pos=boxes,
            visual_attention_mask=rm,
            **kwargs,
        )


def close(ours, theirs, mask):
    torch.testing.assert_close(ours[mask.bool()], theirs[mask.bool()], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory):
    """transformers LxmertForPreTraining (small) and its conversion by the tool."""
    tmp = tmp_path_factory.mktemp("lxmert-pt")
    hf, source, tok = lxmert(transformers.LxmertForPreTraining, "small", tmp)
    assert (
        tool("convert_checkpoint")(
            [str(source), "--from", "lxmert", "--output-dir", str(tmp / "out"), "--tokenizer", str(tok)]
        )
        == 0
    )
    return hf, tmp / "out"


def test_pretraining_heads_and_streams_equal_transformers(pretraining):
    hf, out_dir = pretraining
    ours = VLBertForPreTraining.from_pretrained(out_dir).eval()
    assert ours.config.encoder == "two-stream" and ours.config.region_embedding == "lxmert"
    assert {"mlm", "itm", "mrc", "mrfr", "attr", "qa"} <= set(ours.objectives)
    ids, tt, tm, feats, boxes, rm = inputs(hf.config)
    ref = reference(hf, ids, tt, tm, feats, boxes, rm, output_hidden_states=True)
    with torch.no_grad():
        out = ours(
            ids,
            token_type_ids=tt,
            attention_mask=tm,
            region_features=feats,
            region_boxes=boxes,
            region_mask=rm,
            output_hidden_states=True,
        )
        regions = out.last_hidden_state[:, ids.shape[1] :]
        heads = {"obj": ours.mrc(regions), "attr": ours.attr(regions), "feat": ours.mrfr(regions)}
        answers = ours.qa(out.pooler_output)
    # transformers' LxmertForPreTrainingOutput carries the head outputs; its hidden states the streams
    close(out.prediction_logits, ref.prediction_logits, tm)
    torch.testing.assert_close(out.seq_relationship_logits, ref.cross_relationship_score, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(answers, ref.question_answering_score, atol=1e-5, rtol=1e-5)
    close(out.last_hidden_state[:, : ids.shape[1]], ref.language_hidden_states[-1], tm)
    close(regions, ref.vision_hidden_states[-1], rm)
    visual = hf.obj_predict_head(ref.vision_hidden_states[-1])
    for name, logits in heads.items():
        close(logits, visual[name], rm)
    # text alone (retrieval's text embedding, ITM's hard-negative draw): the language layers, LXMERT's BERT
    with torch.no_grad():
        alone = ours.bert(ids, token_type_ids=tt, attention_mask=tm, output_hidden_states=True)
    assert alone.last_hidden_state.shape == (*ids.shape, hf.config.hidden_size) and len(alone.hidden_states) == 3
    close(alone.last_hidden_state, ref.language_hidden_states[hf.config.l_layers - 1], tm)  # no embeddings there
    from vlbert.layers.unpadded import stream_layouts

    with torch.no_grad():  # the collator's per-stream layout: the text stream's is the one text alone uses
        unpadded = ours.bert(ids, token_type_ids=tt, attention_mask=tm, layout=stream_layouts(tm, rm)).last_hidden_state
    close(unpadded, alone.last_hidden_state, tm)


def test_base_sized_lxmert_model_equals_transformers(tmp_path):
    """BERT-base widths (768 hidden, 12 heads, 2048-d features; one layer per stack: the widths are what a small
    config could hide). The small config's streams are checked through LxmertForPreTraining above."""
    hf, source, tok = lxmert(transformers.LxmertModel, "base", tmp_path)
    assert (
        tool("convert_checkpoint")(
            [str(source), "--from", "lxmert", "--output-dir", str(tmp_path / "out"), "--tokenizer", str(tok)]
        )
        == 0
    )
    ours = VLBertModel.from_pretrained(tmp_path / "out").eval()
    ids, tt, tm, feats, boxes, rm = inputs(hf.config, seed=3)
    ref = reference(hf, ids, tt, tm, feats, boxes, rm)
    with torch.no_grad():
        out = ours(ids, token_type_ids=tt, attention_mask=tm, region_features=feats, region_boxes=boxes, region_mask=rm)
    t = ids.shape[1]
    assert out.last_hidden_state.shape == (3, t + 5, hf.config.hidden_size)
    close(out.last_hidden_state[:, :t], ref.language_output, tm)
    close(out.last_hidden_state[:, t:], ref.vision_output, rm)
    torch.testing.assert_close(out.pooler_output, ref.pooled_output, atol=1e-5, rtol=1e-5)


def write_answers(directory):
    (directory / "answers.json").write_text(json.dumps(ANSWERS))
    return directory / "answers.json"


def test_question_answering_head_equals_transformers_and_names_answers(tmp_path):
    hf, source, tok = lxmert(transformers.LxmertForQuestionAnswering, "small", tmp_path)
    assert (
        tool("convert_checkpoint")(
            [
                str(source),
                "--from",
                "lxmert",
                "--output-dir",
                str(tmp_path / "out"),
                "--tokenizer",
                str(tok),
                "--labels",
                str(write_answers(tmp_path)),
            ]
        )
        == 0
    )
    ours = VLBertForVQA.from_pretrained(tmp_path / "out").eval()
    ids, tt, tm, feats, boxes, rm = inputs(hf.config, seed=5)
    ref = reference(hf, ids, tt, tm, feats, boxes, rm).question_answering_score
    with torch.no_grad():
        out = ours(
            ids, token_type_ids=tt, attention_mask=tm, region_features=feats, region_boxes=boxes, region_mask=rm
        ).logits
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    info = json.loads((tmp_path / "out" / "processor.json").read_text())
    assert info["task"] == "vqa" and info["labels"] == ANSWERS and info["max_regions"] == 36


def airsplay_keys(l_layers, r_layers, x_layers, heads=True) -> set[str]:
    """The state-dict keys of airsplay/lxmert's ``LXRTPretraining`` (``src/lxrt/modeling.py`` at 827087b, with
    obj/attr/feat visual losses and the QA head, as ``run/lxmert_pretrain.bash``), written from its module tree:
    ``bert`` = ``LXRTModel`` (``embeddings``, ``encoder`` = ``LXRTEncoder``, ``pooler``), ``cls``,
    ``obj_predict_head``, ``answer_head``."""
    linear = ("weight", "bias")  # Linear and LayerNorm alike

    def params(prefix, names):
        return {f"{prefix}{n}.{p}" for n in names for p in linear}

    def bert_layer(prefix, attention="attention.", inter="intermediate.", out="output."):
        return (
            params(prefix + attention, ("self.query", "self.key", "self.value", "output.dense", "output.LayerNorm"))
            | params(prefix + inter, ("dense",))
            | params(prefix + out, ("dense", "LayerNorm"))
        )

    keys = {f"bert.embeddings.{n}.weight" for n in ("word_embeddings", "position_embeddings", "token_type_embeddings")}
    keys |= params("bert.embeddings.", ("LayerNorm",)) | params("bert.pooler.", ("dense",))
    keys |= params("bert.encoder.visn_fc.", ("visn_fc", "visn_layer_norm", "box_fc", "box_layer_norm"))
    for i in range(l_layers):
        keys |= bert_layer(f"bert.encoder.layer.{i}.")
    for i in range(r_layers):
        keys |= bert_layer(f"bert.encoder.r_layers.{i}.")
    for i in range(x_layers):  # LXRTXLayer: one BertCrossattLayer (att + output), then per stream
        x = f"bert.encoder.x_layers.{i}."
        keys |= params(
            x + "visual_attention.", ("att.query", "att.key", "att.value", "output.dense", "output.LayerNorm")
        )
        for stream in ("lang", "visn"):
            keys |= bert_layer(x, f"{stream}_self_att.", f"{stream}_inter.", f"{stream}_output.")
    if heads:
        keys |= params("cls.predictions.transform.", ("dense", "LayerNorm")) | params("cls.", ("seq_relationship",))
        keys |= {"cls.predictions.bias", "cls.predictions.decoder.weight"}  # the decoder: the tied word embeddings
        keys |= params(
            "obj_predict_head.",
            ("transform.dense", "transform.LayerNorm", "decoder_dict.obj", "decoder_dict.attr", "decoder_dict.feat"),
        )
        keys |= params("answer_head.logit_fc.", ("0", "2", "3"))
    return keys


def test_airsplay_pth_with_module_prefixes_converts_to_the_same_model(pretraining, tmp_path):
    """airsplay's Epoch20_LXRT.pth layout (nn.DataParallel's ``module.`` on every key, the backbone under ``bert.``):
    the transformers weights under airsplay's names are exactly the keys its code writes, and the tool converts the
    file into the model the transformers directory gives (the forward: transformers', which ports airsplay's)."""
    hf, out_dir = pretraining
    state = {
        ("module.bert." + k[len("lxmert.") :] if k.startswith("lxmert.") else "module." + k): v
        for k, v in hf.state_dict().items()
        if not k.endswith("position_ids")
    }
    cfg = hf.config
    assert {k[len("module.") :] for k in state} == airsplay_keys(cfg.l_layers, cfg.r_layers, cfg.x_layers)
    torch.save(state, tmp_path / "Epoch20_LXRT.pth")
    tok = write_tokenizer(tmp_path / "tok", cfg.vocab_size, cased=False)
    (tmp_path / "heads.json").write_text('{"num_attention_heads": 4}')  # a .pth has no config: 64 per head else
    flags = ["--from", "lxmert", "--tokenizer", str(tok), "--config", str(tmp_path / "heads.json")]
    assert (
        tool("convert_checkpoint")([str(tmp_path / "Epoch20_LXRT.pth"), *flags, "--output-dir", str(tmp_path / "out")])
        == 0
    )
    models = [VLBertForPreTraining.from_pretrained(d) for d in (tmp_path / "out", out_dir)]
    assert models[0].config == models[1].config
    ours, expected = (m.state_dict() for m in models)
    assert ours.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(ours[key], value, rtol=0, atol=0, msg=key)
    # a fine-tuned BEST.pth of src/tasks/vqa_model.py: lxrt_encoder.model.bert.* and logit_fc.*
    finetuned = {
        (
            "lxrt_encoder.model.module.bert." + k[len("module.bert.") :]
            if k.startswith("module.bert.")
            else "logit_fc." + k[len("module.answer_head.logit_fc.") :]
        ): v
        for k, v in state.items()
        if k.startswith(("module.bert.", "module.answer_head."))
    }
    torch.save(finetuned, tmp_path / "BEST.pth")
    assert (
        tool("convert_checkpoint")(
            [
                str(tmp_path / "BEST.pth"),
                *flags,
                "--output-dir",
                str(tmp_path / "vqa"),
                "--labels",
                str(write_answers(tmp_path)),
            ]
        )
        == 0
    )
    vqa = VLBertForVQA.from_pretrained(tmp_path / "vqa").eval()
    ids, tt, tm, feats, boxes, rm = inputs(cfg, seed=7)
    with torch.no_grad():
        torch.testing.assert_close(
            vqa(
                ids, token_type_ids=tt, attention_mask=tm, region_features=feats, region_boxes=boxes, region_mask=rm
            ).logits,
            reference(hf, ids, tt, tm, feats, boxes, rm).question_answering_score,
            atol=1e-5,
            rtol=1e-5,
        )


def test_two_stream_refusals_name_the_fix(pretraining, tmp_path, capsys):
    """Config values the two-stream encoder cannot run and GQA files in neither layout are refused with the fix
    named (docs/bad-input.md rows 89 and 91)."""
    with pytest.raises(ValueError, match="config.encoder must be one of"):
        VLBertConfig(encoder="two stream")
    with pytest.raises(ValueError, match="x_layers must be >= 1"):
        VLBertConfig(encoder="two-stream", x_layers=0)
    from vlbert.data.gqa import load_gqa

    (tmp_path / "q.json").write_text(json.dumps({"1": {"question": "what?"}}))
    with pytest.raises(ValueError, match="lacks imageId/question; is this a GQA questions file"):
        load_gqa(tmp_path / "q.json")
    (tmp_path / "l.json").write_text(json.dumps([{"img_id": "1", "sent": "what?"}]))
    with pytest.raises(ValueError, match="record 0 lacks img_id/question_id/sent"):
        load_gqa(tmp_path / "l.json")
    argv = [
        "--config",
        "configs/finetune/lxmert-gqa.yaml",
        "--init-from",
        str(pretraining[1]),
        "--output-dir",
        str(tmp_path / "run"),
        "--set",
        f"data.train_questions={tmp_path / 'q.json'}",
        "--set",
        f"data.eval_questions={tmp_path / 'q.json'}",
        "--set",
        f"data.shards={tmp_path}",
    ]
    from vlbert.commands import run_tool

    assert run_tool(tool("finetune_vqa"), argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lacks imageId/question" in err[0] and not (tmp_path / "run").exists(), err


def test_attribute_and_question_answering_units():
    """``attr`` labels each masked region with the detector's top attribute (-100 elsewhere) and zeroes its feature;
    ``qa`` rows without an answer (captions) change nothing: the loss of a batch equals that of its question rows."""
    from vlbert.objectives import OBJECTIVES, PrepareContext
    from vlbert.processing.regions import pad_regions

    g = torch.Generator().manual_seed(0)
    items = [
        {
            "region_features": torch.randn(n, 6, generator=g).half().numpy(),
            "region_boxes": torch.tensor([[0.1, 0.1, 0.6, 0.7]] * n).numpy(),
            "attribute_probs": torch.eye(3)[torch.arange(n) % 3].half().numpy(),
            "sample_seed": k,
        }
        for k, n in enumerate((4, 3))
    ]
    batch = pad_regions(items)
    features = batch["region_features"].clone()
    OBJECTIVES["attr"].prepare(batch, items, PrepareContext(text=None, region_mask_probability=0.5))
    masked, labels = batch["masked_regions"], batch["region_attribute_labels"]
    assert masked.sum(1).tolist() == [2, 2] and not masked[1, 3]  # half of the real regions, never padding
    expected = torch.arange(4).remainder(3).expand(2, 4)
    assert torch.equal(labels, expected.masked_fill(~masked, -100))
    # the features travel as they are: the model zeroes the masked ones on the device (VLBertModel.with_region_features)
    assert torch.equal(batch["region_features"], features)

    config = VLBertConfig(
        vocab_size=30,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=16,
        l_layers=1,
        r_layers=1,
        x_layers=1,
        encoder="two-stream",
        region_embedding="lxmert",
        region_location_dim=4,
        region_feature_dim=6,
        num_region_classes=5,
        num_attribute_classes=3,
        num_qa_labels=4,
    )
    torch.manual_seed(0)
    model = VLBertForPreTraining(config).eval()
    ids, mask = ragged_text(3, 5, 30, [5, 4, 3])
    feats, boxes, rm = ragged_regions(3, 4, 6, [4, 2, 3])
    full = model(
        ids,
        attention_mask=mask,
        region_features=feats,
        region_boxes=boxes,
        region_mask=rm,
        qa_label=torch.tensor([-100, 2, -100]),
    )
    alone = model(
        ids[1:2],
        attention_mask=mask[1:2],
        region_features=feats[1:2],
        region_boxes=boxes[1:2],
        region_mask=rm[1:2],
        qa_label=torch.tensor([2]),
    )
    torch.testing.assert_close(full.losses["qa"], alone.losses["qa"])
    assert full.metrics["qa_accuracy"] == alone.metrics["qa_accuracy"]
    assert int(full.counts["qa"]) == int(alone.counts["qa"]) == 1  # DDP weighs each rank by its question rows


def test_pretraining_config_resolves_to_lxmert():
    """configs/vl/lxmert.yaml builds LXMERT's 9/5/5 two-stream model at BERT-base widths with its units."""
    from vlbert.recipes.vl_pretraining import VLDataConfig
    from vlbert.training.run_config import dataclass_from_section, load_run_config
    from vlbert.training.trainer import TrainingConfig

    run = load_run_config("configs/vl/lxmert.yaml")
    TrainingConfig.from_dict(run["training"]).validate()
    data = dataclass_from_section(VLDataConfig, run["data"], "data")
    config = VLBertConfig.from_dict({"vocab_size": 30522, **run["model"]}, strict=True)
    with torch.device("meta"):
        model = VLBertForPreTraining(config)
    encoder = model.bert.encoder
    assert (len(encoder.text.layers), len(encoder.regions.layers), len(encoder.cross_layers)) == (9, 5, 5)
    assert set(data.objectives) <= set(model.objectives) and {"attr", "qa"} <= set(data.objectives)
    assert {s.format for s in data.sources} == {"lxmert"} and model.qa[3].out_features == 9500
    assert (data.max_text_length, data.max_regions, run["training"]["batch_size"]) == (20, 36, 256)


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_text_with_every_region_masked_reads_nothing_of_them(kernel):
    """The "without regions" baseline of VL pretraining masks every region: the text stream then attends to no
    region (its outputs do not depend on the features) and a row's text equals that of an image-less row."""
    config = VLBertConfig(
        vocab_size=30,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=16,
        l_layers=1,
        r_layers=1,
        x_layers=2,
        encoder="two-stream",
        region_embedding="lxmert",
        region_location_dim=4,
        region_feature_dim=6,
        attn_implementation=kernel,
    )
    torch.manual_seed(0)
    model = VLBertModel(config).eval()
    ids, mask = ragged_text(2, 5, 30, [5, 3])
    feats, boxes, _ = ragged_regions(2, 3, 6, [3, 3])
    none, some = torch.zeros(2, 3, dtype=torch.long), torch.tensor([[1, 1, 0], [0, 0, 0]])
    with torch.no_grad():
        a, b, c = (
            model(ids, attention_mask=mask, region_features=f, region_boxes=boxes, region_mask=m).last_hidden_state[
                :, :5
            ]
            for f, m in ((feats, none), (torch.randn(2, 3, 6), none), (feats, some))
        )
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(c[1], a[1])
    assert not torch.allclose(c[0], a[0])
