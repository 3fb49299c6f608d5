"""Visual entailment (SNLI-VE-shaped): the public JSONL reader with its bad inputs, the easy-VQA demonstration
set, and a run of the recipe through the generic fine-tuning tool on a fixture in the public format."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from helpers.builders import tool, write_jsonl

from vlbert.commands import run_tool
from vlbert.data.visual_entailment import LABELS, easy_vqa_entailment, load_snli_ve


def test_reader_public_format_and_bad_inputs(tmp_path):
    good = write_jsonl(
        tmp_path / "ve.jsonl",
        [
            {"Flickr30K_ID": "3416050480", "sentence2": "A dog runs.", "gold_label": "entailment", "pairID": "a"},
            {"Flikr30kID": "1000092795", "sentence2": "Two men sleep.", "gold_label": "contradiction"},
        ],
    )
    examples = load_snli_ve(good, "{image_id}.jpg")
    assert [(e.image_id, e.label) for e in examples] == [("3416050480.jpg", 0), ("1000092795.jpg", 2)]
    assert examples[0].pair_id == "a" and examples[1].hypothesis == "Two men sleep."
    bad_label = write_jsonl(tmp_path / "l.jsonl", [{"Flickr30K_ID": "1", "sentence2": "x", "gold_label": "-"}])
    with pytest.raises(ValueError, match=r"l.jsonl:1: gold_label '-' is not one of"):
        load_snli_ve(bad_label)
    no_image = write_jsonl(tmp_path / "i.jsonl", [{"sentence2": "x", "gold_label": "neutral"}])
    with pytest.raises(ValueError, match="needs Flickr30K_ID"):
        load_snli_ve(no_image)
    (tmp_path / "j.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match=r"j.jsonl:1, column 2: not valid JSON for the SNLI-VE"):
        load_snli_ve(tmp_path / "j.jsonl")


def test_easy_vqa_demonstration_is_balanced_and_true_to_the_image():
    from vlbert.data.easy_vqa import color_and_shape

    examples = easy_vqa_entailment("test")
    counts = Counter(e.label for e in examples)
    assert max(counts.values()) - min(counts.values()) <= 1 and set(counts) == {0, 1, 2}
    truth = color_and_shape("test")
    for e in examples:
        color, shape = truth[e.image_id]
        names_both = color in e.hypothesis.split() and shape in e.hypothesis.split()
        if LABELS[e.label] == "entailment":
            assert color in e.hypothesis.split() or shape in e.hypothesis.split()
        elif LABELS[e.label] == "contradiction":
            assert not names_both


def test_smoke_snli_ve_fixture_runs_through_the_generic_tool(tmp_path):
    """Regions and hypotheses in the public formats (numeric Flickr30K-style ids), a short run of
    tools/finetune.py, and a checkpoint that loads."""
    from PIL import Image
    from vlbert.detectors.config import DetectorConfig
    from vlbert.detectors.shards import write_shards

    from vlbert.data.easy_vqa import color_and_shape, image_paths
    from vlbert.models.vl_classification import VLBertForSequenceClassification

    truth = list(color_and_shape("train").items())[:24]
    ids = [str(1000000 + k) for k in range(len(truth))]
    paths = image_paths("train")
    images = [Image.open(paths[i]).convert("RGB") for i, _ in truth]
    extractor = DetectorConfig(options={"input_size": 96, "max_proposals": 8}).build()
    write_shards(extractor.extract_batch(images, ids), tmp_path / "shards")
    records = []
    for image, (_, (color, shape)) in zip(ids, truth, strict=True):
        records += [
            {"Flickr30K_ID": image, "sentence2": f"there is a {color} {shape}", "gold_label": "entailment"},
            {"Flickr30K_ID": image, "sentence2": f"the {shape} is made of wood", "gold_label": "neutral"},
        ]
    write_jsonl(tmp_path / "train.jsonl", records)
    write_jsonl(tmp_path / "dev.jsonl", records[:16])
    config = tmp_path / "ve.yaml"
    config.write_text(
        f"task: snli-ve\ninit_from: minilm\ndata:\n  dataset: snli-ve\n  train_file: {tmp_path}/train.jsonl\n"
        f"  eval_file: {tmp_path}/dev.jsonl\n  shards: {tmp_path}/shards\n"
        f"training:\n  output_dir: {tmp_path}/out\n  max_steps: 3\n  batch_size: 8\n"
        "  warmup_steps: 1\n  progress_bar: false\n"
    )
    assert run_tool(tool("finetune"), ["--config", str(config)]) == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["accuracy_majority_baseline"] == 0.5 and metrics["step"] == 3
    model = VLBertForSequenceClassification.from_pretrained(tmp_path / "out")
    assert model.loading_info.missing_keys == [] and model.config.num_labels == 3
