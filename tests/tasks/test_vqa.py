"""VQA: accuracy and normalisation on hand-worked examples, soft targets, the VQA v2 reader, data errors, and a
tiny end-to-end fine-tuning run on real easy-VQA questions."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from vlbert.detectors.regions import Regions

from vlbert.data.vqa import VQADataset, VQAExample, build_answer_vocab, load_vqa_v2
from vlbert.data.vqa_answers import answer_targets, normalize_answer, soft_score
from vlbert.evaluation.vqa import vqa_accuracy
from vlbert.processing import VLProcessor


# Hand-worked from vqaEval.py at GT-Vision-Lab/VQA master (commit a013f00), one rule per group.
@pytest.mark.parametrize(
    "raw, normal",
    [
        # processDigitArticle: lower-case, number words "none"/"zero".."ten", articles dropped, single spaces.
        ("Two", "2"),
        ("ten", "10"),
        ("none", "0"),
        ("eleven", "eleven"),
        ("The Dog", "dog"),
        ("an  apple", "apple"),
        ("a", ""),
        # punct list: "-", "!", "{", "}" are marks; ":" and "'" are not (kept), nor are "%", "#", "&".
        ("T-Shirt", "t shirt"),
        ("yes!", "yes"),
        ("{x}", "x"),
        ("10:30", "10:30"),
        ("who's", "who's"),
        ("50%", "50%"),
        ("#1", "#1"),
        ("r&b", "r&b"),
        # a mark touching a space anywhere is deleted everywhere; otherwise replaced by a space.
        ("red,white", "red white"),
        ("a  red, white   car", "red white car"),
        ("x/y z/ w", "xy z w"),
        ("t - shirt", "t shirt"),
        # commaStrip: a digit,digit comma anywhere deletes every mark, with or without a space.
        ("1,000", "1000"),
        ("2,5 (about)", "25 about"),
        ("1,2-3", "123"),
        # periodStrip: a period not followed by a digit is removed, after a digit too (the look-behind slip).
        ("Dog.", "dog"),
        ("3.", "3"),
        ("3.5", "3.5"),
        ("3.5.", "3.5"),
        ("e.g.", "eg"),
        (".5", ".5"),
        # contractions, straight apostrophes, after the article/number step; upper-case keys never match.
        ("dont know", "don't know"),
        ("whos", "who's"),
        ("Wheres", "where's"),
        ("somebody'd", "somebodyd"),
        ("Im", "im"),
        ("Ive", "ive"),
        # tabs and newlines are spaces; the answer is stripped.
        ("yes\tno\n", "yes no"),
    ],
)
def test_official_answer_processing(raw, normal):
    assert normalize_answer(raw) == normal


def test_official_period_rule_removes_at_most_32_periods():
    assert normalize_answer("." * 40) == "." * 8  # re.UNICODE (32) passed as re.sub's count
    assert normalize_answer("a." * 40) == "a" * 32 + "a." * 8  # one word: the first 32 periods go


def test_unanimous_answers_and_the_prediction_are_compared_as_they_are():
    # Ten identical (stripped) answers: neither they nor the prediction are processed.
    assert vqa_accuracy("Yes", ["yes"] * 10) == 0.0
    assert vqa_accuracy("yes.", ["yes"] * 10) == 0.0
    assert vqa_accuracy("10:30", ["10:30"] * 10) == 1.0
    assert vqa_accuracy(" yes\n", ["yes"] * 9 + ["yes\t"]) == 1.0  # cleaning happens first: still unanimous
    assert vqa_accuracy("yes", ["Yes"] * 10) == 0.0
    assert vqa_accuracy("two", ["two"] * 10) == 1.0 and vqa_accuracy("2", ["two"] * 10) == 0.0


def test_differing_answers_and_the_prediction_are_both_processed():
    # As soon as one answer differs, every answer and the prediction go through both steps.
    assert vqa_accuracy("Yes!", ["yes"] * 9 + ["no"]) == 1.0
    assert vqa_accuracy("two", ["2"] * 9 + ["Two."]) == 1.0  # "two" -> "2", "Two." -> "2": ten matches
    assert vqa_accuracy("T-Shirt", ["t shirt"] * 2 + ["shirt"] * 8) == pytest.approx((2 * (1 / 3) + 8 * (2 / 3)) / 10)
    assert vqa_accuracy("dont know", ["don't know"] * 3 + ["no"] * 7) == pytest.approx((3 * (2 / 3) + 7) / 10)
    assert vqa_accuracy("who's", ["whos"] * 5 + ["who"] * 5) == 1.0  # "whos" -> "who's" by the table


def test_three_annotator_leave_one_out_rule():
    # 10 annotators. Each annotator's score: min(1, matches among the other 9 / 3); then the mean.
    assert vqa_accuracy("cat", ["cat"] * 3 + ["dog"] * 7) == pytest.approx((3 * (2 / 3) + 7 * 1.0) / 10)
    assert vqa_accuracy("cat", ["cat"] * 4 + ["dog"] * 6) == 1.0
    assert vqa_accuracy("cat", ["cat"] * 1 + ["dog"] * 9) == pytest.approx(9 * (1 / 3) / 10)
    assert vqa_accuracy("cat", ["cat"] * 2 + ["dog"] * 8) == pytest.approx((2 * (1 / 3) + 8 * (2 / 3)) / 10)
    assert vqa_accuracy("bird", ["cat"] * 10) == 0.0


def test_single_reference_extension():
    assert vqa_accuracy("circle", ["circle"]) == 1.0 and vqa_accuracy("square", ["circle"]) == 0.0
    assert vqa_accuracy("Circle", ["circle"]) == 0.0  # one answer is unanimous: compared as it is
    with pytest.raises(ValueError):
        vqa_accuracy("x", [])


def test_soft_targets_and_vocabulary_follow_the_official_forms():
    assert [soft_score(c) for c in range(5)] == [0, 1 / 3, 2 / 3, 1, 1]
    vocab = {"cat": 0, "dog": 1, "Yes": 2, "yes": 3}
    assert answer_targets(["cat"] * 2 + ["Dog."] * 7 + ["emu"], vocab) == {0: pytest.approx(2 / 3), 1: 1.0}
    # Ten identical "Yes" stay "Yes" (the official code would score the prediction "yes" 0 there) ...
    assert answer_targets(["Yes"] * 10, vocab) == {2: 1.0}
    # ... and a vocabulary entry scores exactly what its target promises.
    assert vqa_accuracy("Yes", ["Yes"] * 10) == 1.0 and vqa_accuracy("yes", ["Yes"] * 10) == 0.0
    examples = [VQAExample("1", "i", "q", ("Yes",) * 10), VQAExample("2", "i", "q", ("yes",) * 9 + ("Yes!",))]
    assert build_answer_vocab(examples) == ["Yes", "yes"]  # ten each, ties by text


def test_vqa_v2_reader(tmp_path):
    (tmp_path / "q.json").write_text(
        json.dumps(
            {
                "questions": [
                    {"question_id": 11, "image_id": 42, "question": "What color is the bus?"},
                    {"question_id": 12, "image_id": 43, "question": "How many dogs?"},
                ]
            }
        )
    )
    (tmp_path / "a.json").write_text(
        json.dumps(
            {
                "annotations": [
                    {"question_id": 11, "image_id": 42, "answers": [{"answer": "red"}] * 8 + [{"answer": "Red."}] * 2},
                    {"question_id": 12, "image_id": 43, "answers": [{"answer": "two"}] * 10},
                ]
            }
        )
    )
    examples = load_vqa_v2(tmp_path / "q.json", tmp_path / "a.json", "COCO_val2014_{image_id:012d}")
    assert examples[0] == VQAExample(
        "11", "COCO_val2014_000000000042", "What color is the bus?", tuple(["red"] * 8 + ["Red."] * 2)
    )
    # "Red." is processed (the answers differ); ten identical "two" are kept as given. 10 votes each: by text.
    assert build_answer_vocab(examples) == ["red", "two"]
    (tmp_path / "bad.json").write_text(json.dumps({"annotations": [{"question_id": 99, "answers": []}]}))
    with pytest.raises(ValueError, match="not in"):
        load_vqa_v2(tmp_path / "q.json", tmp_path / "bad.json")


def test_vqa_dataset_errors(tokenizer):
    regions = {"img": Regions("img", 10, 10, [[0, 0, 10, 10]], np.zeros((1, 4)), [1.0])}
    ok = VQAExample("1", "img", "what shape?", ("circle",))
    no_regions = VQAExample("2", "other", "what shape?", ("circle",))
    unknown = VQAExample("3", "img", "what shape?", ("hexagon",))
    with pytest.raises(ValueError, match="no regions"):
        VQADataset([ok, no_regions], regions, VLProcessor(tokenizer), ["circle"])
    with pytest.raises(ValueError, match="none of which is in the 1-answer vocabulary"):
        VQADataset([ok, unknown], regions, VLProcessor(tokenizer), ["circle"])
    dropped = VQADataset([ok, unknown], regions, VLProcessor(tokenizer), ["circle"], unknown="drop")
    assert len(dropped) == 1 and dropped.unanswerable == 1
    kept = VQADataset(
        [ok, unknown], regions, VLProcessor(tokenizer), ["circle"], unknown="keep"
    )  # evaluation: every question
    assert len(kept) == 2 and kept.unanswerable == 1 and kept[1]["answer_targets"].tolist() == [0.0]
    with pytest.raises(ValueError, match="unknown must be one of 'error', 'drop', 'keep'"):
        VQADataset([ok], regions, VLProcessor(tokenizer), ["circle"], unknown="skip")


@pytest.mark.slow
def test_vqa_finetuning_end_to_end(tmp_path):
    from vlbert.recipes import RECIPES, run

    out = tmp_path / "vqa"
    shards = tmp_path / "shards"
    _write_easy_vqa_shards(shards, 400, 200)
    config = {
        "init_from": "minilm",
        "data": {"dataset": "easy-vqa", "shards": str(shards), "max_train_examples": 400, "max_eval_examples": 200},
        "training": {
            "output_dir": str(out),
            "max_steps": 40,
            "batch_size": 16,
            "learning_rate": 1e-4,
            "warmup_steps": 6,
            "log_every": 10,
            "progress_bar": False,
        },
    }
    metrics = run(RECIPES["vqa"], config)
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == metrics["eval_questions"] == 200
    # Fine-tuning must beat always giving the most frequent training answer, by a margin (measured: 0.66 vs 0.34 at
    # 40 steps, 0.67 at 48, 0.43 at 32).
    assert metrics["vqa_accuracy"] >= metrics["vqa_accuracy_majority_baseline"] + 0.1, metrics


def _write_easy_vqa_shards(directory, n_train, n_test):
    """Real regions for the first easy-VQA images of each split that the first questions use."""
    from PIL import Image
    from vlbert.detectors.config import DetectorConfig
    from vlbert.detectors.shards import write_shards

    from vlbert.data.easy_vqa import image_paths, load_questions

    extractor = DetectorConfig(options={"input_size": 96, "max_proposals": 16}).build()
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


# --- The recipe's figures against the benchmarks' own evaluation code, over every evaluation question -----------


def _finetune(dataset: str, files: dict, easy, doc_runs, out) -> dict:
    """One step of VQA fine-tuning from the tiny VL run of `doc_runs` on the `easy` regions, then the recipe's own
    evaluation (the figures and files under test)."""
    from dataclasses import asdict

    from helpers.builders import EASY_DETECTOR

    from vlbert.recipes import RECIPES, run

    config = {
        "init_from": str(doc_runs["vl-default"]),
        "detector": asdict(EASY_DETECTOR),
        "data": {
            "dataset": dataset,
            "shards": str(easy.shards),
            "min_answer_count": 1,
            **{k: str(v) for k, v in files.items()},
        },
        "training": {"output_dir": str(out), "max_steps": 1, "batch_size": 4, "warmup_steps": 1, "progress_bar": False},
    }
    return run(RECIPES["vqa"], config)


def _vqa_v2_files(root, name: str, questions: list[tuple[int, str, list[str]]]) -> tuple:
    """The official VQA v2 questions and annotations files (every field VQA.loadRes and VQAEval read) of
    ``questions``: (question id, image id in `easy`, the ten annotators' answers)."""
    meta = {"info": {}, "task_type": "Open-Ended", "data_type": "mscoco", "data_subtype": name, "license": {}}
    qs = [{"question_id": qid, "image_id": int(image), "question": f"question {qid}?"} for qid, image, _ in questions]
    anns = [
        {
            "question_id": qid,
            "image_id": int(image),
            "question_type": "what",
            "answer_type": "other",
            "multiple_choice_answer": answers[0],
            "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": k + 1} for k, a in enumerate(answers)],
        }
        for qid, image, answers in questions
    ]
    (root / f"{name}_questions.json").write_text(json.dumps({**meta, "questions": qs}))
    (root / f"{name}_annotations.json").write_text(json.dumps({**meta, "annotations": anns}))
    return root / f"{name}_questions.json", root / f"{name}_annotations.json"


def test_vqa_v2_accuracy_is_the_official_evaluation_over_every_question(easy, doc_runs, tmp_path):
    """The recipe's vqa_accuracy equals GT-Vision-Lab/VQA@a013f00's own VQA.loadRes + VQAEval (vendored in
    tests/official/) run on the recipe's own results file, question by question, with 3 of the 6 evaluation
    questions unanswerable (no annotated answer in the 2-answer vocabulary "Yes", "no"): they are evaluated too (the
    official loadRes refuses a results file that lacks one), and one of them earns 0.9 if the model answers "Yes"
    ("yes" x3 + "maybe" x7: the answers differ, so both sides are processed to "yes")."""
    from official.vqa import VQA
    from official.vqaEval import VQAEval

    train = [(1, "0", ["Yes"] * 10), (2, "1", ["no"] * 10), (3, "2", ["Yes"] * 10), (4, "3", ["no"] * 10)]
    held_out = [
        (11, "4", ["Yes"] * 10),
        (12, "5", ["no"] * 6 + ["yes"] * 4),
        (13, "6", ["yes"] * 3 + ["maybe"] * 7),
        (14, "7", ["red"] * 10),
        (15, "8", ["No"] * 5 + ["nope"] * 5),
        (16, "9", ["two"] * 9 + ["2"]),
    ]
    q_train, a_train = _vqa_v2_files(tmp_path, "train", train)
    q_eval, a_eval = _vqa_v2_files(tmp_path, "val", held_out)
    out = tmp_path / "run"
    metrics = _finetune(
        "vqa-v2",
        {
            "train_questions": q_train,
            "train_annotations": a_train,
            "eval_questions": q_eval,
            "eval_annotations": a_eval,
        },
        easy,
        doc_runs,
        out,
    )
    assert json.loads((out / "processor.json").read_text())["labels"] == ["Yes", "no"]
    assert (
        metrics["eval_questions"] == 6 and metrics["eval_unanswerable"] == 3
    )  # 0886c57: 3 questions, unanswerable ones dropped

    vqa = VQA(str(a_eval), str(q_eval))
    official = VQAEval(vqa, vqa.loadRes(str(out / "vqa_results.json"), str(q_eval)), n=2)
    official.evaluate()
    assert official.accuracy["overall"] == round(100 * metrics["vqa_accuracy"], 2)
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert {int(r["question_id"]): round(100 * r["accuracy"], 2) for r in rows} == official.evalQA
    assert {r["answer"] for r in rows} <= {"Yes", "no"}


def gqa_eval_accuracy(questions: dict, predictions: list[dict]) -> float:
    """GQA's official accuracy, restated from its ``eval.py`` (distributed with the dataset, no license; read in the
    public copy junayednaushad/Relation-Network-VQA@613d4a2 ``gqa/eval.py``, whose main loop matches
    bitshrine/quipvlm@b6003cf ``gqa/eval.py``): ``predictions = {p["questionId"]: p["prediction"]}``; a balanced
    question without a prediction raises "missing predictions"; for every question ``predicted =
    predictions[qid]``, and over the questions with ``isBalanced`` the score is ``float(predicted == gold)``;
    ``accuracy = avg(scores) * 100`` (``avg`` of an empty list: 0)."""
    predictions = {p["questionId"]: p["prediction"] for p in predictions}
    missing = [qid for qid, q in questions.items() if qid not in predictions and q["isBalanced"]]
    if missing:
        raise AssertionError(f"no prediction for question {missing[0]}: missing predictions")
    scores = []
    for qid, question in questions.items():
        predicted = predictions[qid]
        if question["isBalanced"]:
            scores.append(float(1 if predicted == question["answer"] else 0))
    return (float(sum(scores)) / len(scores) if scores else 0) * 100


def test_gqa_accuracy_is_gqa_evaluation_over_every_question(easy, doc_runs, tmp_path):
    """The recipe's gqa_accuracy (times 100) equals GQA's eval.py accuracy (:func:`gqa_eval_accuracy`) on the
    recipe's own gqa_predictions.json, over all 8 balanced evaluation questions, 3 of them with an answer no
    training question has ("green", "teal", "Red": exact match, so not "red")."""

    def questions(answers, first):
        return {
            str(first + k): {"imageId": str(k % 12), "question": f"what is {k}?", "answer": a, "isBalanced": True}
            for k, a in enumerate(answers)
        }

    train = questions(["red", "blue", "circle", "red", "yes"], 100)
    held_out = questions(["red", "blue", "green", "circle", "teal", "yes", "Red", "blue"], 200)
    (tmp_path / "train_balanced_questions.json").write_text(json.dumps(train))
    (tmp_path / "val_balanced_questions.json").write_text(json.dumps(held_out))
    out = tmp_path / "run"
    metrics = _finetune(
        "gqa",
        {
            "train_questions": tmp_path / "train_balanced_questions.json",
            "eval_questions": tmp_path / "val_balanced_questions.json",
        },
        easy,
        doc_runs,
        out,
    )
    assert metrics["eval_questions"] == 8 and metrics["eval_unanswerable"] == 3  # 0886c57: 5, the 3 dropped
    predictions = json.loads((out / "gqa_predictions.json").read_text())
    assert 100 * metrics["gqa_accuracy"] == pytest.approx(gqa_eval_accuracy(held_out, predictions), abs=1e-9)
    assert {p["prediction"] for p in predictions} <= {"red", "blue", "circle", "yes"}
