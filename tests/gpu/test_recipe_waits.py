"""Zero host waits on the fake GPU for the recipes tests/gpu/test_gpu_trainer.py leaves out (issue 66, item 4):
NLVR2, RefCOCO, GQA (the VQA recipe on GQA's questions) and VL pretraining with UNITER's ITM on hard negatives.

Each test runs the recipe's default run at one process through :func:`test_gpu_trainer.run_on_fake_gpu` (the
trainer's GPU defaults inside :class:`fake_cuda.FakeCuda`; steps 2 and 3 recorded) and asserts what
:func:`test_gpu_trainer.assert_gpu_step` does: every parameter, gradient and master on the GPU, no host
synchronisation, nothing read back, every batch sent ahead on a side stream; and no blocking host-to-device copy.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers.fake_cuda import FakeCuda
from test_gpu_trainer import (  # noqa: F401 (region_shards, tiny_bert: the module's fixtures)
    assert_gpu_step,
    finetuning_config,
    region_shards,
    run_on_fake_gpu,
    tiny_bert,
    vl_config,
)
from vlbert.detectors.shards import write_shards
from vlbert.detectors.store import RegionStore


def assert_no_wait(probe, gpu: FakeCuda, flash: bool = True) -> None:
    assert_gpu_step(probe, gpu, flash)
    assert gpu.host_to_device and not any(copy.blocking for copy in gpu.host_to_device), [
        (c.line, c.shape) for c in gpu.host_to_device if c.blocking
    ]


def _nlvr2(config: dict, shards, tmp_path) -> dict:
    """NLVR2's public layout over 8 statement pairs of the easy-VQA images: shards aliasing the images under the
    NLVR2 names (``train-<set>-<pair>-img<k>``), a JSONL file of 16 statements, half true."""
    store = RegionStore(shards)
    ids = sorted(store, key=lambda i: (not i.startswith("train"), i))[:16]
    aliases = tmp_path / "nlvr2-shards"
    stems = [f"train-{p // 4}-{p % 4}" for p in range(8)]
    write_shards(
        [replace(store[ids[2 * p + k]], image_id=f"{stem}-img{k}") for p, stem in enumerate(stems) for k in (0, 1)],
        aliases,
    )
    rows = [
        {"identifier": f"{stem}-{n}", "sentence": f"statement {n} about {stem}", "label": ["True", "False"][n]}
        for stem in stems
        for n in (0, 1)
    ]
    (tmp_path / "nlvr2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config["data"] = {
        "dataset": "nlvr2",
        "shards": str(aliases),
        "train_file": str(tmp_path / "nlvr2.jsonl"),
        "eval_file": str(tmp_path / "nlvr2.jsonl"),
        "max_regions": 6,
        "max_eval_examples": 4,
    }
    return config


def _gqa(config: dict, shards, tmp_path) -> dict:
    """GQA's balanced-split questions over the easy-VQA training images of the shards (one answer each)."""
    ids = [i for i in RegionStore(shards) if i.startswith("train")][:8]
    answers = ["red", "blue", "circle", "yes"]
    questions = {
        str(100 + k): {"imageId": ids[k % len(ids)], "question": f"what is shape {k}?", "answer": answers[k % 4]}
        for k in range(16)
    }
    (tmp_path / "gqa.json").write_text(json.dumps(questions))
    config["data"] = {
        "dataset": "gqa",
        "shards": str(shards),
        "train_questions": str(tmp_path / "gqa.json"),
        "eval_questions": str(tmp_path / "gqa.json"),
        "min_answer_count": 1,
        "max_regions": 6,
        "max_eval_examples": 4,
    }
    return config


@pytest.mark.parametrize("task", ["nlvr2", "gqa"])
def test_a_pair_or_gqa_step_makes_the_host_wait_for_nothing(task, region_shards, tiny_bert, tmp_path):
    """NLVR2 (two images per statement, both [CLS] classified together) and the VQA recipe on GQA's questions, each
    at its defaults from a one-layer BERT: steps 2 and 3 wait on nothing."""
    config = finetuning_config("vqa", tmp_path / "run", tiny_bert, region_shards, tmp_path)
    config["task"] = task if task == "nlvr2" else "vqa"
    config = (_nlvr2 if task == "nlvr2" else _gqa)(config, region_shards, tmp_path)
    probe, gpu = run_on_fake_gpu(config["task"], config)
    assert_no_wait(probe, gpu)


def test_itm_on_hard_negatives_makes_the_host_wait_for_nothing(region_shards, tmp_path):
    """VL pretraining on ITM with its negatives drawn by similarity from the batch (``data.itm_negatives: hard``,
    vlbert/objectives/image_text_matching.py): the two unimodal passes, the draw on the device and the joint pass
    over the rewritten texts wait on nothing at one process; all three run on the padded batch (no flash varlen: the
    drawn texts' layout is the device's). On fa33627 each of the three read its layout from the mask: 3 ``nonzero``
    a step (unpadded.py:60 from_mask, under image_text_matching.py:81 and :82 and vl.py's joint pass)."""
    config = vl_config(tmp_path / "run", region_shards, 1)
    config["data"]["objectives"] = {"itm": 1}
    config["data"]["itm_negatives"] = "hard"
    probe, gpu = run_on_fake_gpu("vl-pretraining", config)
    assert_no_wait(probe, gpu, flash=False)
    assert gpu.ops["aten.searchsorted"] == 2, dict(gpu.ops)  # one draw a step, on the device
