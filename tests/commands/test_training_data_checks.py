"""Training data is checked as evaluation data is, and every data record is read through its type (issue 68, items 3
and 4): through ``vlbert finetune``, each case is one ``error:`` line naming the file, the record and the field (and
the type expected), refused while the data is read, before any training, with no run directory left behind
(docs/bad-input.md rows 127-128)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import yaml
from helpers.builders import EASY_DETECTOR
from helpers.tool_errors import one_line_error


def _qa(qid: str, answers, **extra) -> dict:
    return {"id": qid, "question": "where is it ?", "context": "It stands in Paris", "answers": answers, **extra}


PARIS = {"text": ["Paris"], "answer_start": [13]}
QA_CASES = {
    "v1.1-without-an-answer": (
        _qa("b", {"text": [], "answer_start": []}),
        ["record 1 (id 'b') has no answer (field 'answers' is empty)", "version_2_with_negative: true"],
    ),
    "v1.1-is-impossible": (
        _qa("b", PARIS, is_impossible=True),
        ["record 1 (id 'b') is marked is_impossible", "SQuAD v1.1 trains and scores every question"],
    ),
    "answers-as-squads-list": (
        _qa("b", [{"text": "Paris", "answer_start": 13}]),
        ["record 1: field 'answers' must be a mapping of lists", "got a list of 1 answers", "SQuAD's original"],
    ),
}


@pytest.mark.parametrize("case", list(QA_CASES))
def test_squad_training_records_are_checked_as_evaluation_records_are(capsys, tmp_path, case):
    record, expected = QA_CASES[case]
    good = tmp_path / "eval.jsonl"
    good.write_text(json.dumps(_qa("a", PARIS)) + "\n")
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps(_qa("a", PARIS)) + "\n" + json.dumps(record) + "\n")
    out = tmp_path / "run"
    argv = ["--task", "text", "--dataset", "custom", "--type", "qa", "--train", str(train), "--eval", str(good)]
    line = one_line_error(capsys, "finetune", [*argv, "--max-steps", "1", "--output-dir", str(out)])
    assert line.startswith(f"error: {train}: record 1"), line
    assert all(text in line for text in expected), line
    assert not out.exists()


def _region_run(tmp_path, doc_runs, easy, task: str, data: dict) -> list[str]:
    """The finetune flags of a ``task`` run on the `easy` regions with ``data`` (its file entries)."""
    config = {
        "task": task,
        "init_from": str(doc_runs["vl-default"]),
        "detector": asdict(EASY_DETECTOR),
        "data": {"shards": str(easy.shards), **data},
        "training": {"max_steps": 1, "batch_size": 2, "warmup_steps": 1, "progress_bar": False},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    return ["--config", str(tmp_path / "run.yaml"), "--output-dir", str(tmp_path / "run")]


def _write(path, value) -> str:
    path.write_text(json.dumps(value))
    return str(path)


def test_vqa_and_gqa_training_questions_are_checked(capsys, tmp_path, doc_runs, easy):
    questions = [{"question_id": q, "image_id": q, "question": "what?"} for q in (1, 2)]
    annotations = [{"question_id": 1, "answers": [{"answer": "red"}] * 10}]  # question 2 has none
    q_file, a_file = tmp_path / "q.json", tmp_path / "a.json"
    data = {
        "dataset": "vqa-v2",
        "train_questions": _write(q_file, {"questions": questions}),
        "train_annotations": _write(a_file, {"annotations": annotations}),
        "eval_questions": str(q_file),
    }
    line = one_line_error(capsys, "finetune", _region_run(tmp_path, doc_runs, easy, "vqa", data))
    assert f"{q_file}: record 1 of 'questions' (question_id 2) has no annotation in {a_file}" in line, line
    assert "pair the questions and annotations files of the same split" in line
    _write(a_file, {"annotations": [{"question_id": 1, "answers": "red"}, {"question_id": 2, "answers": []}]})
    line = one_line_error(capsys, "finetune", _region_run(tmp_path, doc_runs, easy, "vqa", data))
    assert f"{a_file}: record 0 of 'annotations': field 'answers' must be a list, got str 'red'" in line, line

    gqa = [{"img_id": "0", "question_id": "q0", "sent": "what?", "label": {"red": 1.0}}]
    gqa.append({"img_id": "1", "question_id": "q1", "sent": "what?", "label": ["red"]})
    data = {"dataset": "gqa", "train_questions": _write(tmp_path / "gqa.json", gqa), "eval_questions": "x"}
    line = one_line_error(capsys, "finetune", _region_run(tmp_path, doc_runs, easy, "vqa", data))
    assert f"{tmp_path / 'gqa.json'}: record 1: field 'label' (answer -> score" in line, line
    assert "must be a mapping, got list ['red']" in line, line
    assert not (tmp_path / "run").exists()


def test_a_referring_box_outside_its_image_is_refused(capsys, tmp_path, doc_runs, easy):
    refs = [{"ref_id": 1, "ann_id": 10, "image_id": 0, "split": "train", "sentences": [{"sent": "the shape"}]}]
    instances = {"images": [{"id": 0, "width": 64, "height": 64}], "annotations": [{"id": 10, "bbox": [40, 8, 40, 9]}]}
    data = {
        "dataset": "refcoco",
        "refs_file": _write(tmp_path / "refs.json", refs),
        "instances_file": _write(tmp_path / "instances.json", instances),
    }
    line = one_line_error(capsys, "finetune", _region_run(tmp_path, doc_runs, easy, "refcoco", data))
    assert f"{tmp_path / 'instances.json'}: annotation 10 (field 'bbox', referred to by ref 1)" in line, line
    assert "= [40, 8, 40, 9] lies outside its image 0 (64x64)" in line, line
    assert not (tmp_path / "run").exists()


def test_retrieval_test_images_listed_twice_or_without_regions_are_refused_before_training(
    capsys, tmp_path, doc_runs, easy
):
    def image(name: str, split: str) -> dict:
        return {"filename": name, "split": split, "sentences": [{"raw": f"picture {name}"}]}

    images = [image("0", "train"), image("1", "train"), image("2", "test"), image("3", "test"), image("2", "test")]
    data = {"dataset": "karpathy", "captions_file": _write(tmp_path / "captions.json", {"images": images})}
    line = one_line_error(capsys, "finetune", _region_run(tmp_path, doc_runs, easy, "retrieval", data))
    assert f"{tmp_path / 'captions.json'}: image '2' is listed twice in split 'test' (images 0 and 2" in line, line
    images[-1] = image("no-such-image", "test")
    _write(tmp_path / "captions.json", {"images": images})
    line = one_line_error(capsys, "finetune", _region_run(tmp_path, doc_runs, easy, "retrieval", data))
    assert "image 'no-such-image' (image 2 of split 'test') has no regions in data.shards" in line, line
    assert not (tmp_path / "run").exists()
