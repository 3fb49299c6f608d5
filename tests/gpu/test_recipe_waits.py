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
import test_gpu_trainer
import torch
import torch.nn.functional as F
from helpers.fake_cuda import FakeCuda
from test_gpu_trainer import assert_gpu_step, finetuning_config, run_on_fake_gpu, vl_config
from vlbert.detectors.cache import cached_shards
from vlbert.detectors.shards import write_shards
from vlbert.detectors.store import RegionStore

import vlbert
from vlbert.models.inputs import VLInputs
from vlbert.objectives.image_text_matching import ImageTextMatching
from vlbert.recipes import RECIPES
from vlbert.recipes.config_reading import read_run_config
from vlbert.recipes.referring_expressions import DATASETS as REFCOCO_DATASETS

#: the fixtures of tests/gpu/test_gpu_trainer.py (module-scoped: set up once here too)
region_shards, tiny_bert = test_gpu_trainer.region_shards, test_gpu_trainer.tiny_bert


def assert_no_wait(probe, gpu: FakeCuda, flash: bool = True) -> None:
    assert_gpu_step(probe, gpu, flash)
    assert gpu.host_to_device and not any(copy.blocking for copy in gpu.host_to_device), [
        (c.line, c.shape) for c in gpu.host_to_device if c.blocking
    ]


def _nlvr2(config: dict, shards, tmp_path) -> dict:
    """NLVR2's public layout over 8 statement pairs of the easy-VQA images: shards aliasing the images under the
    NLVR2 names (``train-<set>-<pair>-img<k>``), a JSONL file of 16 statements, half true."""
    store = RegionStore(shards)
    ids = list(store)
    aliases = tmp_path / "nlvr2-shards"
    stems = [f"train-{p // 4}-{p % 4}" for p in range(8)]
    write_shards(
        [
            replace(store[ids[(p + k) % len(ids)]], image_id=f"{stem}-img{k}")
            for p, stem in enumerate(stems)
            for k in (0, 1)
        ],
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
    ids = list(RegionStore(shards))
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


@pytest.mark.parametrize("model", [{}, test_gpu_trainer.TWO_STREAM], ids=["single-stream", "two-stream"])
def test_itm_on_hard_negatives_makes_the_host_wait_for_nothing(region_shards, tmp_path, model):
    """VL pretraining on ITM with its negatives drawn by similarity from the batch (``data.itm_negatives: hard``,
    vlbert/objectives/image_text_matching.py): the two unimodal passes, the draw on the device and the joint pass
    over the rewritten texts wait on nothing at one process; all three run on the padded batch (no flash varlen: the
    drawn texts' layout is the device's). On fa33627 each of the three read its layout from the mask: 3 ``nonzero``
    a step (unpadded.py:60 from_mask, under image_text_matching.py:81 and :82 and vl.py's joint pass); LXMERT's two
    streams did until run_padded reached them (07caafa: 8 ``nonzero`` in steps 2 and 3, from_mask)."""
    config = vl_config(tmp_path / "run", region_shards, 1, **model)
    config["data"]["objectives"] = {"itm": 1}
    config["data"]["itm_negatives"] = "hard"
    probe, gpu = run_on_fake_gpu("vl-pretraining", config)
    assert_no_wait(probe, gpu, flash=False)
    assert gpu.ops["aten.searchsorted"] == 2, dict(gpu.ops)  # one draw a step, on the device


def test_the_padded_hard_negative_pass_equals_the_unpadded_one():
    """The padded passes of a hard-negative ITM batch (the fix above) compute what the encoder reading its layout
    from the mask computed (ragged texts and regions, so that the reference unpads): the same ITM logits (so the same
    drawn texts) and loss to float32 rounding, on the CPU."""
    torch.manual_seed(0)
    config = vlbert.VLBertConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        region_feature_dim=12,
        num_region_classes=0,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = vlbert.VLBertForPreTraining(config).eval()
    b = 8
    lengths = torch.tensor([6, 3, 5, 4, 6, 2, 5, 3])
    ids = torch.randint(5, 60, (b, 6)) * (torch.arange(6) < lengths[:, None])
    mask = (ids != 0).long()
    region_mask = (torch.arange(5) < torch.tensor([5, 2, 3, 5, 1, 4, 5, 2])[:, None]).long()
    inputs = VLInputs(
        input_ids=ids,
        attention_mask=mask,
        region_features=torch.randn(b, 5, 12),
        region_boxes=torch.rand(b, 5, 4),
        region_mask=region_mask,
    )
    labels = {
        "itm_label": torch.tensor([1, 0, 1, 0, 0, 1, 0, 1]),
        "itm_content": torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]),
        "itm_draw": torch.linspace(0.05, 0.95, b),
    }
    with torch.no_grad():
        out = model(inputs, **labels)
        rewritten = ImageTextMatching().before_encoder(model, inputs, labels)  # unpadded: its layout from the mask
        reference = model.itm(model.bert(rewritten).pooler_output)
    assert model.bert.encoder.unpad  # run_padded gave the setting back
    assert torch.allclose(out.seq_relationship_logits, reference, atol=1e-5), (out.seq_relationship_logits, reference)
    assert torch.allclose(out.losses["itm"], F.cross_entropy(reference, labels["itm_label"]), atol=1e-5)


def refcoco_config(output_dir, init, tmp_path) -> dict:
    """RefCOCO on 12 + 4 easy-VQA composites with the tiles as regions (``boxes: gt``), their regions extracted
    here, on the CPU, into the run's cache (the fake GPU computes no features)."""
    config = finetuning_config("vqa", output_dir, init, None, tmp_path)
    config["task"] = "refcoco"
    config["detector"] = {"input_size": 96, "max_proposals": 8}
    config["data"] = {"cache_dir": str(tmp_path / "cache"), "train_images": 12, "eval_images": 4, "max_regions": 6}
    training, data, detector = read_run_config(RECIPES["refcoco"], config)
    files, tiles = REFCOCO_DATASETS["easy-vqa"].load(data, training.seed)[2]
    cached_shards(detector, files, data.cache_dir, "refcoco-composites", boxes=tiles)
    return config


def test_a_refcoco_step_makes_the_host_wait_for_nothing(tiny_bert, tmp_path):
    """RefCOCO's default run from a one-layer BERT (one region chosen among each composite's tiles): steps 2 and 3
    wait on nothing."""
    probe, gpu = run_on_fake_gpu("refcoco", refcoco_config(tmp_path / "run", tiny_bert, tmp_path))
    assert_no_wait(probe, gpu)
