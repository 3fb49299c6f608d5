"""``python -m benchmarks itc-vs-itm`` at a tiny size: both arms rank the same held-out images and captions, and
its figures are the retrieval evaluation's own (the ITC arm's ITC-only R@1 is what ``evaluate_retrieval`` gives with
a shortlist of 1, whose re-rank cannot move the first candidate; the full re-rank's is ``shortlist`` 0's)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import itc_vs_itm
from vlbert.data.retrieval import easy_vqa_captioned
from vlbert.evaluation.retrieval import evaluate_retrieval
from vlbert.models.retrieval import VLBertForImageTextRetrieval
from vlbert.processing import VLProcessor

TINY = ["--steps", "3", "--images", "24", "--eval-images", "8", "--seeds", "0", "--batch-size", "8"]
SMALL = ["--set", "detector.options.input_size=96", "--set", "data.eval_fraction=0.25"]


def test_both_arms_rank_the_same_held_out_set_and_report_the_evaluations_figures(tmp_path, capsys):
    root = tmp_path
    argv = [*TINY, *SMALL, "--output-dir", str(root), "--json"]
    assert itc_vs_itm.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {r["arm"]: r for r in map(json.loads, out[:2])}
    assert set(rows) == {"itm", "itc+itm"} and "itc+itm (ITC only)" in "\n".join(out[2:])
    expected = easy_vqa_captioned("test")[:8]  # test images: no run trained on them
    for row in rows.values():
        assert row["seed"] == 0 and "eval_itm_accuracy" in row
    assert "eval_itc_accuracy_chance" in rows["itc+itm"] and "eval_itc_accuracy" not in rows["itm"]
    # chance by content: the mean share of a caption's content among the images (one caption per image here)
    groups = [im.group for im in expected]
    chance = sum(groups.count(g) for g in groups) / len(groups) ** 2
    assert rows["itm"]["chance_t2i"] == pytest.approx(chance) == rows["itc+itm"]["chance_i2t"]

    config = itc_vs_itm.arm_config({"itm": 1}, 0, 3, 24, 8, str(root / "region-cache"), str(root / "x"), SMALL[1::2])
    images, regions = itc_vs_itm.evaluation_set(config, 8)
    assert images == expected
    for arm, shortlist, method in (("itc+itm", 1, "itc"), ("itm", 0, "full"), ("itc+itm", 0, "full")):
        run_dir = root / f"{arm}-seed0"
        model = VLBertForImageTextRetrieval.from_pretrained(run_dir).eval()
        with torch.no_grad():
            figures = evaluate_retrieval(model, images, regions, VLProcessor.from_pretrained(run_dir), shortlist)
        for direction in ("t2i", "i2t"):
            key = f"{direction}_r1_group"
            assert rows[arm][f"{method}_{key}"] == figures[key], (arm, method, key)
