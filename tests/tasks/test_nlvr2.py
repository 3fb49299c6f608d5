"""NLVR2: the public JSONL reader and its bad inputs, the easy-VQA demonstration's labels, the pair model's
shapes and symmetry, and a short run of the recipe on a fixture in the public format."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers.builders import tool, write_jsonl

from vlbert.commands import run_tool
from vlbert.data.nlvr2 import easy_vqa_image_pairs, load_nlvr2


def test_reader_names_the_two_images_and_refuses_bad_lines(tmp_path):
    good = write_jsonl(
        tmp_path / "dev.json",
        [
            {"identifier": "dev-850-0-0", "sentence": "There are two dogs.", "label": "True", "left_url": "x"},
            {"identifier": "dev-850-0-1", "sentence": "No dog is brown.", "label": "False"},
        ],
    )
    examples = load_nlvr2(good)
    assert [(e.left_image, e.right_image, e.label) for e in examples] == [
        ("dev-850-0-img0", "dev-850-0-img1", 1),
        ("dev-850-0-img0", "dev-850-0-img1", 0),
    ]
    assert load_nlvr2(good, "{stem}-img{k}.png")[0].right_image == "dev-850-0-img1.png"
    for record, message in (
        ({"identifier": "dev-850-0", "sentence": "x", "label": "True"}, "is not <split>-<set>"),
        ({"identifier": "dev-1-0-0", "sentence": "x", "label": "yes"}, "label 'yes' is not"),
        ({"identifier": "dev-1-0-0", "label": "True"}, "'sentence'"),
    ):
        with pytest.raises(ValueError, match=message):
            load_nlvr2(write_jsonl(tmp_path / "bad.json", [record]))


def test_easy_vqa_statements_are_true_exactly_when_labelled():
    from vlbert.data.easy_vqa import color_and_shape

    truth = color_and_shape("test")
    examples = easy_vqa_image_pairs("test", 600)
    assert sum(e.label for e in examples) == 300
    for e in examples:
        (lc, ls), (rc, rs) = truth[e.left_image], truth[e.right_image]
        words = e.sentence.split()
        if e.sentence.startswith("both images show"):
            value = ls == rs == words[-1]
        elif e.sentence.startswith("exactly one"):
            value = (ls == words[-1]) != (rs == words[-1])
        elif e.sentence.startswith("both shapes are"):
            value = lc == rc == words[-1]
        else:
            value = lc == words[5] and rc != words[5]
        assert value == bool(e.label), e


def test_pair_model_encodes_each_image_with_the_statement():
    import vlbert
    from vlbert.models.vl_classification import VLBertForImagePairClassification

    config = vlbert.VLBertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        region_feature_dim=6,
        num_labels=2,
    )
    model = VLBertForImagePairClassification(config).eval()
    ids = torch.randint(1, 50, (3, 5))
    feats, boxes = torch.randn(3, 2, 4, 6), torch.rand(3, 2, 4, 2).repeat(1, 1, 1, 2)
    boxes[..., 2:] += 0.1
    out = model(ids, region_features=feats, region_boxes=boxes, labels=torch.tensor([0, 1, 1]))
    assert out.logits.shape == (3, 2) and out.counts["cls"] == 3
    swapped = model(ids, region_features=feats.flip(1), region_boxes=boxes.flip(1)).logits
    assert not torch.allclose(swapped, out.logits)  # left and right are not interchangeable
    with pytest.raises(ValueError, match=r"\[batch, 2, regions, dim\]"):
        model(ids, region_features=feats[:, 0], region_boxes=boxes[:, 0])


def test_smoke_nlvr2_fixture_runs_through_its_tool(tmp_path):
    from PIL import Image
    from vlbert.detectors.config import DetectorConfig
    from vlbert.detectors.shards import write_shards

    from vlbert.data.easy_vqa import color_and_shape, image_paths

    truth = list(color_and_shape("train").items())[:16]
    paths = image_paths("train")
    ids = [f"train-{k // 2}-0-img{k % 2}" for k in range(len(truth))]
    images = [Image.open(paths[i]).convert("RGB") for i, _ in truth]
    extractor = DetectorConfig(options={"input_size": 96, "max_proposals": 8}).build()
    write_shards(extractor.extract_batch(images, ids), tmp_path / "shards")
    records = [
        {"identifier": f"train-{k}-0-{j}", "sentence": s, "label": label}
        for k in range(8)
        for j, (s, label) in enumerate(
            (("both images show a circle", "True"), ("exactly one image shows a circle", "False"))
        )
    ]
    write_jsonl(tmp_path / "train.json", records)
    assert (
        run_tool(
            tool("finetune_nlvr2"),
            [
                "--init-from",
                "minilm",
                "--output-dir",
                str(tmp_path / "out"),
                "--max-steps",
                "2",
                "--set",
                "data.dataset=nlvr2",
                "--set",
                f"data.train_file={tmp_path / 'train.json'}",
                "--set",
                f"data.eval_file={tmp_path / 'train.json'}",
                "--set",
                f"data.shards={tmp_path / 'shards'}",
                "--set",
                "training.batch_size=4",
                "--set",
                "training.warmup_steps=1",
                "--set",
                "training.progress_bar=false",
            ],
        )
        == 0
    )
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["accuracy_majority_baseline"] == 0.5 and metrics["step"] == 2


def nlvr2_metrics(predictions_csv: str, labeled_jsonl: str) -> tuple[float, float]:
    """(precision, consistency) as NLVR2's official script computes them, restated from lil-lab/nlvr@e6a286a
    ``nlvr2/eval/metrics.py`` (no license, so not vendored): each CSV line is stripped and split on ","
    (identifier, prediction); a missing prediction stops it; an example is correct when ``prediction.lower() ==
    label.lower()``; its sentence is its identifier with the third "-" field blanked; precision = correct /
    examples, consistency = sentences with every example correct / unique sentences."""
    predictions = {}
    for line in predictions_csv.splitlines(keepends=True):
        if line:
            splits = line.strip().split(",")
            predictions[splits[0]] = splits[1]
    labeled = [json.loads(line) for line in labeled_jsonl.splitlines(keepends=True) if line]
    assert len(predictions) >= len(labeled), "Some predictions are missing!"
    num_correct, consistency = 0.0, {}
    for example in labeled:
        anon = example["identifier"].split("-")
        anon[2] = ""
        anon = "-".join(anon)
        consistency.setdefault(anon, True)
        if predictions[example["identifier"]].lower() == example["label"].lower():
            num_correct += 1.0
        else:
            consistency[anon] = False
    return num_correct / len(labeled), sum(1.0 for c in consistency.values() if c) / len(consistency)


def test_accuracy_and_consistency_are_the_official_scripts_on_the_recipes_file(easy, doc_runs, tmp_path):
    """The recipe's accuracy and consistency equal NLVR2's metrics.py (:func:`nlvr2_metrics`) on its own
    predictions.csv: 9 statements, 4 unique sentences shown with 1 to 3 image pairs each (identifiers that differ in
    the pair field), labels mixed within a sentence so that consistency differs from accuracy whatever the model
    answers (0886c57 reports no consistency)."""
    import shutil
    from dataclasses import asdict, replace

    from helpers.builders import EASY_DETECTOR
    from vlbert.detectors.shards import DETECTOR_INFO, write_shards

    from vlbert.recipes import RECIPES, run

    stems = ["dev-0-0", "dev-0-1", "dev-0-2", "dev-1-0", "dev-1-1"]
    shards = tmp_path / "shards"  # the stems' images: aliases of the `easy` regions
    write_shards(
        [
            replace(easy.store[str(2 * p + k)], image_id=f"{stem}-img{k}")
            for p, stem in enumerate(stems)
            for k in (0, 1)
        ],
        shards,
    )
    shutil.copy(easy.shards / DETECTOR_INFO, shards / DETECTOR_INFO)
    # Always "True": accuracy 4/9, consistency 1/4; always "False": 5/9 and 2/4.
    sentences = {
        ("0", "0"): ["True"] * 3,
        ("0", "1"): ["False"] * 3,
        ("1", "0"): ["True", "False"],
        ("1", "1"): ["False"],
    }
    records = [
        {"identifier": f"dev-{s}-{pair}-{n}", "sentence": f"sentence {s}-{n}", "label": label}
        for (s, n), labels in sentences.items()
        for pair, label in enumerate(labels)
    ]
    write_jsonl(tmp_path / "dev.json", records)
    out = tmp_path / "run"
    metrics = run(
        RECIPES["nlvr2"],
        {
            "init_from": str(doc_runs["vl-default"]),
            "detector": asdict(EASY_DETECTOR),
            "data": {
                "dataset": "nlvr2",
                "train_file": str(tmp_path / "dev.json"),
                "eval_file": str(tmp_path / "dev.json"),
                "shards": str(shards),
            },
            "training": {
                "output_dir": str(out),
                "max_steps": 1,
                "batch_size": 4,
                "warmup_steps": 1,
                "progress_bar": False,
            },
        },
    )
    precision, consistency = nlvr2_metrics((out / "predictions.csv").read_text(), (tmp_path / "dev.json").read_text())
    assert metrics["eval_statements"] == 9 and metrics["eval_sentences"] == 4
    assert metrics["accuracy"] != metrics["consistency"]
    assert (metrics["accuracy"], metrics["consistency"]) == (precision, consistency)
    p = metrics["accuracy"]  # the end-of-run verdict's noise: the binomial standard error over the 9 statements
    assert metrics["accuracy_n"] == 9 and metrics["accuracy_stderr"] == pytest.approx(math.sqrt(p * (1 - p) / 9))
