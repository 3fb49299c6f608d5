"""VQA: accuracy and normalisation on hand-worked examples, soft targets, the VQA v2 reader, data errors, and a
tiny end-to-end fine-tuning run on real easy-VQA questions."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from detectors.regions import Regions
from vlbert.data.vqa import VQADataset, VQAExample, build_answer_vocab, load_vqa_v2
from vlbert.evaluation.vqa import answer_targets, normalize_answer, soft_score, vqa_accuracy


@pytest.mark.parametrize("raw, normal", [
    ("Two", "2"), ("The Dog.", "dog"), ("1,000", "1000"), ("2.5", "2.5"), ("ten", "10"), ("none", "0"),
    ("a  red, white   car", "red white car"),        # ", " touches a space: the comma is deleted
    ("red,white", "red white"),                      # no space touching: replaced by a space
    ("x/y z/ w", "xy z w"),                          # "/ " anywhere: every "/" is deleted, joining x and y
    ("2,5 (about)", "25 about"),                     # a digit,digit comma: every mark is deleted
    ("3.", "3"), ("3.5.", "3.5"),                    # the look-behind slip: a period after a digit goes too
    ("10:30", "10 30"), ("it's", "it s"),            # ":" and "'" are official marks (no space: a space)
    ("50%", "50%"), ("yes!", "yes!"), ("t-shirt", "t-shirt"), ("#1", "#1"),  # not official marks: kept
    ("dont know", "don’t know"), ("wheres", "where's"),  # the official table, curly and straight quotes
    ("Im", "im"), ("Ive", "ive"),                    # upper-case keys never match after lower-casing
    ("yes\tno\n", "yes no"),
])
def test_official_answer_processing(raw, normal):
    assert normalize_answer(raw) == normal


def test_official_period_rule_removes_at_most_32_periods():
    assert normalize_answer("." * 40) == "." * 8  # re.UNICODE (32) passed as re.sub's count


def test_unanimous_answers_are_compared_raw():
    # Ten identical answers are not processed (the official rule, kept for text-reading answers) ...
    assert vqa_accuracy("yes", ["Yes"] * 10) == 0.0
    assert vqa_accuracy("10:30", ["10:30"] * 10) == 0.0  # the prediction becomes "10 30", the answers stay
    assert vqa_accuracy("Yes", ["yes"] * 10) == 1.0     # ... while the prediction always is
    # ... but as soon as they differ, they go through the punctuation rule (not the digit/article rule).
    assert vqa_accuracy("10:30", ["10:30"] * 9 + ["ten thirty"]) == 1.0
    assert vqa_accuracy("two", ["two"] * 9 + ["2"]) == pytest.approx(0.3)  # "2" matches one annotator


def test_three_annotator_rule():
    # 10 annotators. Each annotator's score: min(1, matches among the other 9 / 3); then the mean.
    assert vqa_accuracy("cat", ["cat"] * 3 + ["dog"] * 7) == pytest.approx((3 * (2 / 3) + 7 * 1.0) / 10)
    assert vqa_accuracy("cat", ["cat"] * 4 + ["dog"] * 6) == 1.0
    assert vqa_accuracy("cat", ["cat"] * 1 + ["dog"] * 9) == pytest.approx(9 * (1 / 3) / 10)
    assert vqa_accuracy("cat", ["cat"] * 2 + ["dog"] * 8) == pytest.approx((2 * (1 / 3) + 8 * (2 / 3)) / 10)
    assert vqa_accuracy("bird", ["cat"] * 10) == 0.0
    assert vqa_accuracy("Two.", ["2"] * 10) == 1.0  # the prediction is processed
    assert vqa_accuracy("circle", ["circle"]) == 1.0 and vqa_accuracy("square", ["circle"]) == 0.0
    with pytest.raises(ValueError):
        vqa_accuracy("x", [])


def test_soft_targets():
    assert [soft_score(c) for c in range(5)] == [0, 1 / 3, 2 / 3, 1, 1]
    vocab = {"cat": 0, "dog": 1}
    targets = answer_targets(["cat"] * 2 + ["dog"] * 7 + ["emu"], vocab)
    assert targets == {0: pytest.approx(2 / 3), 1: 1.0}


def test_vqa_v2_reader(tmp_path):
    (tmp_path / "q.json").write_text(json.dumps({"questions": [
        {"question_id": 11, "image_id": 42, "question": "What color is the bus?"},
        {"question_id": 12, "image_id": 43, "question": "How many dogs?"}]}))
    (tmp_path / "a.json").write_text(json.dumps({"annotations": [
        {"question_id": 11, "image_id": 42, "answers": [{"answer": "red"}] * 8 + [{"answer": "Red."}] * 2},
        {"question_id": 12, "image_id": 43, "answers": [{"answer": "two"}] * 10}]}))
    examples = load_vqa_v2(tmp_path / "q.json", tmp_path / "a.json", "COCO_val2014_{image_id:012d}")
    assert examples[0] == VQAExample("11", "COCO_val2014_000000000042", "What color is the bus?",
                                     tuple(["red"] * 8 + ["Red."] * 2))
    assert build_answer_vocab(examples) == ["2", "red"]  # 10 votes each: ties sorted by text
    (tmp_path / "bad.json").write_text(json.dumps({"annotations": [{"question_id": 99, "answers": []}]}))
    with pytest.raises(ValueError, match="not in"):
        load_vqa_v2(tmp_path / "q.json", tmp_path / "bad.json")


def test_vqa_dataset_errors(tokenizer):
    regions = {"img": Regions("img", 10, 10, [[0, 0, 10, 10]], np.zeros((1, 4)), [1.0])}
    ok = VQAExample("1", "img", "what shape?", ("circle",))
    no_regions = VQAExample("2", "other", "what shape?", ("circle",))
    unknown = VQAExample("3", "img", "what shape?", ("hexagon",))
    with pytest.raises(ValueError, match="no regions"):
        VQADataset([ok, no_regions], regions, tokenizer, ["circle"])
    with pytest.raises(ValueError, match="none of which is in the 1-answer vocabulary"):
        VQADataset([ok, unknown], regions, tokenizer, ["circle"])
    assert len(VQADataset([ok, unknown], regions, tokenizer, ["circle"], drop_unknown=True)) == 1


def test_vqa_finetuning_end_to_end(tmp_path):
    from vlbert.recipes import RECIPES, run

    out = tmp_path / "vqa"
    shards = tmp_path / "shards"
    _write_easy_vqa_shards(shards, 400, 200)
    config = {
        "init_from": "minilm",
        "data": {"dataset": "easy-vqa", "shards": str(shards), "max_train_questions": 400, "max_eval_questions": 200},
        "training": {"output_dir": str(out), "max_steps": 60, "batch_size": 16, "learning_rate": 1e-4,
                     "warmup_steps": 6, "log_every": 10, "progress_bar": False},
    }
    metrics = run(RECIPES["vqa"], config)
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == metrics["eval_questions"] == 200
    # Fine-tuning must beat always giving the most frequent training answer, by a margin.
    assert metrics["vqa_accuracy"] >= metrics["vqa_accuracy_majority_baseline"] + 0.1, metrics


def _write_easy_vqa_shards(directory, n_train, n_test):
    """Real regions for the first easy-VQA images of each split that the first questions use."""
    from PIL import Image

    from detectors.shards import write_shards
    from vlbert.data.easy_vqa import image_paths, load_questions
    from detectors.config import DetectorConfig

    extractor = DetectorConfig(input_size=96, max_proposals=16).build()
    wanted = []
    for split, count in (("train", n_train), ("test", n_test)):
        ids = list(dict.fromkeys(q.image_id for q in load_questions(split)[:count]))
        wanted += ids
    paths = {**image_paths("train"), **image_paths("test")}
    images = [Image.open(paths[i]).convert("RGB") for i in wanted]
    write_shards(extractor.extract_batch(images, wanted), directory)


def test_recall_at_k_hand_worked():
    from vlbert.evaluation.retrieval import recall_at_k

    scores = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.3, 0.8], [0.7, 0.6, 0.1]])
    # query 0 -> item 0 (rank 1); query 1 -> item 0 (rank 3); query 2 -> items {1, 2}: item 1 at rank 2.
    r = recall_at_k(scores, [{0}, {0}, {1, 2}], ks=(1, 2, 3))
    assert r == {1: pytest.approx(1 / 3), 2: pytest.approx(2 / 3), 3: 1.0}
    shortlisted = scores.clone()
    shortlisted[1, 0] = float("-inf")  # the right item fell outside the shortlist
    assert recall_at_k(shortlisted, [{0}, {0}, {1, 2}], ks=(3,))[3] == 1.0  # -inf still ranks last, within 3
    with pytest.raises(ValueError, match="at least one"):
        recall_at_k(scores, [{0}, set(), {1}])
