"""Multi-process training: 2 CPU processes (gloo, torch's elastic agent as torchrun runs it, the workers forked:
:func:`helpers.distributed.launch`) at per-process batch b give the same per-step losses
as 1 process at batch 2b; and a 2-process run with dropout, stopped and resumed, gives the uninterrupted run's
losses (every rank's random streams restored)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.builders import write_easy_vqa_shards
from helpers.distributed import config, forked_reference_run, launch, losses, reference_run, stopped_copy


@pytest.mark.slow
@pytest.mark.integration
def test_two_processes_stopped_and_resumed_equal_the_uninterrupted_run(small_corpus, tmp_path):
    """With dropout on, each rank draws its own masks (its own stream, saved in every checkpoint with the other
    ranks'). A 2-process run stopped after step 10 (what a kill leaves: the log to step 10, the complete
    checkpoint of step 8) and resumed on 2 processes gives the uninterrupted run's losses for steps 9 to 16. (A
    kill during a checkpoint's write: tests/training/test_trainer_hooks.py.)"""
    reference, stopped = tmp_path / "reference", tmp_path / "stopped"
    steps = 16

    def dropout_config(out):
        run_config = config(small_corpus, out, 4, steps, save_every=4, save_total_limit=0)
        run_config["model"].update(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
        return run_config

    launch([["text-pretraining", dropout_config(reference)]])
    state = torch.load(reference / "checkpoints" / "step-8" / "training_state.pt", weights_only=True)
    assert len(state["rng"]) == 2 and not torch.equal(state["rng"][0]["torch"], state["rng"][1]["torch"])
    stopped_copy(reference, stopped, 8, 10)
    launch([["text-pretraining", dropout_config(stopped), "resume"]])
    a, b = losses(reference), losses(stopped)
    assert sorted(b) == list(range(1, steps + 1))
    assert max(abs(a[s] - b[s]) for s in a) <= 1e-6, (a, b)
    assert a[9] != a[10]


@pytest.fixture(scope="module")
def easy_vqa_shards(tmp_path_factory) -> Path:
    """Region shards of 32 easy-VQA training images (a tiny detector: 64-pixel input, 6 proposals)."""
    return write_easy_vqa_shards(tmp_path_factory.mktemp("easy-vqa") / "shards", 32)


@pytest.mark.slow
@pytest.mark.integration
def test_vl_pretraining_two_processes_equal_one_without_unused_parameter_search(easy_vqa_shards, tmp_path):
    """VL pretraining draws one objective per step for both ranks; the heads of the other objectives stay in the
    graph with weight zero, so DDP runs without find_unused_parameters and 2 x b = 1 x 2b, step by step. ITM draws
    hard negatives from the global batch (both ranks' captions), with word-region alignment on its batches. The
    same launch trains a VQA model with a trainable visual backbone on the images: :func:`check_backbone_vqa`."""

    def vl_config(out, batch_size):
        return {
            "modality": "vl",
            "tokenizer": "minilm",
            "model": {
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "intermediate_size": 64,
                "hidden_dropout_prob": 0.0,
                "attention_probs_dropout_prob": 0.0,
            },
            "data": {
                "shards": str(easy_vqa_shards),
                "max_images": 32,
                "eval_fraction": 0.0,
                "objectives": {"mlm": 1, "mrfr": 1, "mrc": 1, "mrc_kl": 1, "itm": 4, "wra": 0.1},
                "itm_negatives": "hard",
            },
            "training": {
                "output_dir": str(out),
                "max_steps": 8,
                "batch_size": batch_size,
                "learning_rate": 1e-3,
                "warmup_steps": 1,
                "log_every": 1,
                "progress_bar": False,
            },
        }

    one, two = tmp_path / "one", tmp_path / "two"
    reference_run(vl_config(one, 8), "vl-pretraining")
    vqa = backbone_vqa_config(easy_vqa_shards, tmp_path)  # the same launch also trains a visual backbone
    reference_run(vqa(tmp_path / "vqa-one", 8), "vqa")
    runs = [["vl-pretraining", vl_config(two, 4)], ["vqa", vqa(tmp_path / "vqa-two", 4)]]
    launch(runs)
    check_backbone_vqa(vqa, tmp_path)
    a, b = losses(one), losses(two)
    assert sorted(a) == sorted(b) == list(range(1, 9))
    assert max(abs(a[s] - b[s]) for s in a) <= 1e-5, (a, b)
    objectives = [
        next(k for k in ("mlm", "mrfr", "mrc", "mrc_kl", "itm") if k in r)
        for r in map(json.loads, (two / "log.jsonl").read_text().splitlines())
        if r["split"] == "train"
    ]
    assert len(set(objectives)) >= 3 and "itm" in objectives  # the steps did mix objectives
    itm_rows = [r for r in map(json.loads, (two / "log.jsonl").read_text().splitlines()) if "itm" in r]
    assert all("wra" in r and "wra_mismatched_distance" in r for r in itm_rows)


def backbone_vqa_config(shards: Path, root: Path):
    """VQA with a trainable timm backbone (MobileNetV3, random weights; stem and first level frozen, every BatchNorm
    frozen in eval mode, its own learning rate) over a tiny BERT: the 32 images' easy-VQA questions as VQA v2 files,
    boxes from ``shards``, pixels from ``<root>/images/train/<n>.png``; a checkpoint every 3 steps."""
    import vlbert
    from vlbert.data.easy_vqa import image_paths, load_questions
    from vlbert.tokenization import load_tokenizer

    tokenizer = load_tokenizer("minilm")
    tiny = vlbert.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    vlbert.BertModel(tiny).save_pretrained(root / "tiny", tokenizer=tokenizer)
    ids = set(_shard_ids(shards))
    questions = [q for q in load_questions("train") if q.image_id in ids][:48]
    (root / "images" / "train").mkdir(parents=True)
    for image_id in {q.image_id for q in questions}:
        shutil.copy(image_paths("train")[image_id], root / "images" / f"{image_id}.png")
    records = [
        {"question_id": n, "image_id": int(q.image_id.split("/")[1]), "question": q.question}
        for n, q in enumerate(questions)
    ]
    (root / "q.json").write_text(json.dumps({"questions": records}))
    (root / "a.json").write_text(
        json.dumps(
            {
                "annotations": [
                    {"question_id": n, "answers": [{"answer": q.answer}] * 10} for n, q in enumerate(questions)
                ]
            }
        )
    )
    files = {
        "train_questions": str(root / "q.json"),
        "train_annotations": str(root / "a.json"),
        "eval_questions": str(root / "q.json"),
        "eval_annotations": str(root / "a.json"),
    }

    def config(out, batch_size):
        return {
            "task": "vqa",
            "init_from": str(root / "tiny"),
            "model": {
                "hidden_dropout_prob": 0.0,
                "attention_probs_dropout_prob": 0.0,
                "visual_backbone": {
                    "kind": "timm",
                    "model": "mobilenetv3_small_050",
                    "roi_size": 2,
                    "learning_rate": 3e-3,
                },
            },
            "data": {
                "dataset": "vqa-v2",
                "shards": str(shards),
                "image_dir": str(root / "images"),
                "image_id_format": "train/{image_id}",
                "image_short_side": 48,
                "max_regions": 4,
                "max_eval_examples": 8,
                **files,
            },
            "training": {
                "output_dir": str(out),
                "max_steps": 6,
                "batch_size": batch_size,
                "learning_rate": 1e-3,
                "warmup_steps": 1,
                "log_every": 1,
                "save_every": 3,
                "save_total_limit": 0,
                "progress_bar": False,
            },
        }

    return config


def _shard_ids(shards: Path) -> list[str]:
    from vlbert.detectors.store import RegionStore

    return list(RegionStore(shards).keys())


def check_backbone_vqa(config, root: Path) -> None:
    """2 processes at batch 4 = 1 at batch 8 step by step, with the backbone trained (its weights moved); a run
    stopped after step 5 (its log to step 5, the checkpoint of step 3) and resumed in this process gives the
    uninterrupted run's losses (its data order, optimizer state and the backbone's own parameter group restored)."""
    from safetensors.torch import load_file

    a, b = losses(root / "vqa-one"), losses(root / "vqa-two")
    assert sorted(a) == sorted(b) == list(range(1, 7))
    assert max(abs(a[s] - b[s]) for s in a) <= 1e-5, (a, b)
    start = load_file(root / "vqa-one" / "checkpoints" / "step-3" / "model.safetensors")
    end = load_file(root / "vqa-one" / "model.safetensors")
    moved = [k for k in start if "visual_backbone" in k and not torch.equal(start[k], end[k])]
    frozen = ("conv_stem", "blocks.0.", ".bn")  # stages 1-2 (the stem, the first level) and every BatchNorm
    assert any("blocks.4" in k for k in moved) and not any(f in k for k in moved for f in frozen), moved
    stopped = root / "vqa-stopped"
    stopped_copy(root / "vqa-one", stopped, 3, 5)
    reference_run(config(stopped, 8), "vqa", resume=True)
    c = losses(stopped)
    assert sorted(c) == list(range(1, 7)) and max(abs(a[s] - c[s]) for s in a) <= 1e-6, (a, c)
    assert a[4] != a[5]


@pytest.mark.slow
@pytest.mark.integration
def test_two_stream_on_two_processes_equals_one_and_resumes_exactly(easy_vqa_shards, tmp_path):
    """LXMERT's two-stream encoder (issue 42) under DDP, with the GPU default (bf16 weights, float32 masters) and 2
    micro-batches per step: 2 processes at batch 4 give 1 process at batch 8's losses step by step, over its
    pretraining units (MLM, feature regression, detected labels, ITM with hard negatives drawn over the global batch
    from the language layers' text embeddings, and QA on LXMERT's JSON whose questions fall
    unevenly on the ranks: each rank weighs by its question rows). Each rank sums its micro-batches' gradients in
    float32 and the ranks average the sums; a bf16 model rounds each micro-batch's weight gradient (a sum over 4
    rows here, 8 there) before the float32 sum, so the losses agree to 2e-4, not float32's 1e-5 (ranks that did
    not average drift by orders of magnitude more; the per-row QA count was 1.03 off). A run stopped after step
    5 (its log to step 5, the checkpoint of step 3) and resumed gives the uninterrupted run's losses for steps 4 to
    6. The resume runs in this process (one launch less; multi-process resume with per-rank streams is
    :func:`test_two_processes_stopped_and_resumed_equal_the_uninterrupted_run`'s, and nothing in it is particular
    to the encoder)."""
    from vlbert.data.easy_vqa import color_and_shape

    truth = color_and_shape("train")
    records = [
        {
            "img_id": i,
            "sentf": {"mscoco": [f"a {c} {s}"], "vqa": [f"what color is the {s}?"]},
            "labelf": {"vqa": [{c: 1.0}]},
        }
        for i, (c, s) in list(truth.items())[:16]
    ]
    (tmp_path / "lxmert.json").write_text(json.dumps(records))

    def two_stream_config(out, batch_size):
        return {
            "modality": "vl",
            "tokenizer": "minilm",
            "model": {
                "encoder": "two-stream",
                "l_layers": 1,
                "r_layers": 1,
                "x_layers": 1,
                "region_embedding": "lxmert",
                "region_location_dim": 4,
                "hidden_size": 32,
                "num_attention_heads": 2,
                "intermediate_size": 64,
                "hidden_dropout_prob": 0.0,
                "attention_probs_dropout_prob": 0.0,
            },
            "data": {
                "sources": [
                    {
                        "name": "lxmert",
                        "format": "lxmert",
                        "path": str(tmp_path / "lxmert.json"),
                        "shards": str(easy_vqa_shards),
                    }
                ],
                "eval_fraction": 0.0,
                "objectives": {"mlm": 1, "mrfr": 1, "mrc": 1, "itm": 1, "qa": 4},
                "itm_negatives": "hard",
            },
            "training": {
                "output_dir": str(out),
                "max_steps": 6,
                "batch_size": batch_size,
                "learning_rate": 1e-3,
                "warmup_steps": 1,
                "log_every": 1,
                "save_every": 3,
                "save_total_limit": 0,
                "mixed_precision": "bf16-params",
                "grad_accum_steps": 2,
                "progress_bar": False,
            },
        }

    one, two, stopped = tmp_path / "one", tmp_path / "two", tmp_path / "stopped"
    forked_reference_run(two_stream_config(one, 8), "vl-pretraining")  # (bf16-params: in a child)
    launch([["vl-pretraining", two_stream_config(two, 4)]])
    a, b = losses(one), losses(two)
    assert sorted(a) == sorted(b) == list(range(1, 7))
    assert a[1] == b[1] and max(abs(a[s] - b[s]) for s in a) <= 2e-4, (a, b)
    objectives = {
        next(k for k in ("mlm", "mrfr", "mrc", "itm", "qa") if k in r)
        for r in map(json.loads, (two / "log.jsonl").read_text().splitlines())
        if r["split"] == "train"
    }
    assert len(objectives) >= 3 and {"qa", "itm"} <= objectives, objectives  # the steps did mix the units
    stopped_copy(one, stopped, 3, 5)
    forked_reference_run(two_stream_config(stopped, 8), "vl-pretraining", resume=True)
    c = losses(stopped)
    assert sorted(c) == list(range(1, 7))
    assert max(abs(a[s] - c[s]) for s in a) <= 1e-6, (a, c)


@pytest.mark.slow
@pytest.mark.integration
def test_text_fine_tuning_on_three_processes_with_a_short_last_batch(tmp_path):
    """28 BBC News articles at batch 8 on 3 ranks: the last global batch holds 4 items, which used to leave one
    rank an empty batch (a crash in collation while the others waited). Now every rank gets at least one item and
    the 3 processes equal 1 process at batch 24, step by step."""
    import vlbert
    from vlbert.tokenization import load_tokenizer

    tokenizer = load_tokenizer("minilm")
    tiny = vlbert.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    vlbert.BertModel(tiny).save_pretrained(tmp_path / "tiny", tokenizer=tokenizer)

    def text_config(out, batch_size):
        return {
            "task": "text",
            "init_from": str(tmp_path / "tiny"),
            "model": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
            "data": {"dataset": "bbc-news", "max_seq_length": 24, "max_train_examples": 28, "eval_fraction": 0.01},
            "training": {
                "output_dir": str(out),
                "max_steps": 4,
                "batch_size": batch_size,
                "learning_rate": 1e-3,
                "warmup_steps": 1,
                "log_every": 1,
                "progress_bar": False,
            },
        }

    one, three = tmp_path / "one", tmp_path / "three"
    reference_run(text_config(one, 24), "text")
    launch([["text", text_config(three, 8)]], nproc=3)
    a, b = losses(one), losses(three)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    assert max(abs(a[s] - b[s]) for s in a) <= 1e-5, (a, b)
    # The final evaluation is split across the 3 ranks and gathered: the same figures as one process.
    m1, m3 = (json.loads((d / "metrics.json").read_text()) for d in (one, three))
    assert m1["accuracy"] == m3["accuracy"] and m1["macro_f1"] == m3["macro_f1"]
    assert abs(m1["eval_cls_loss"] - m3["eval_cls_loss"]) <= 1e-6
