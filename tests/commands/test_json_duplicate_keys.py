"""A user's JSON file that gives a key twice in one object is refused, as a YAML file is (issue 68, item 4): the
standard parser keeps the last one silently (an annotation's answer given twice, a processor.json hand-edited with a
second ``labels``). Through the tools: one ``error:`` line naming the file and the key, nothing written, and the
user's file byte-identical (docs/bad-input.md row 137)."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict

import yaml
from helpers.builders import EASY_DETECTOR
from helpers.tool_errors import one_line_error


def test_an_annotation_file_giving_a_key_twice_is_refused(capsys, tmp_path, doc_runs, easy):
    questions = [{"question_id": q, "image_id": q, "question": "what?"} for q in (1, 2)]
    (tmp_path / "q.json").write_text(json.dumps({"questions": questions}))
    answers = json.dumps([{"answer": "red", "answer_id": k + 1} for k in range(10)])
    annotation = '{"question_id": %d, "multiple_choice_answer": "red", "multiple_choice_answer": "blue", "answers": '
    annotation += answers + "}"
    a_file = tmp_path / "a.json"
    a_file.write_text('{"annotations": [%s, %s]}' % (annotation % 1, annotation % 2))
    written = a_file.read_bytes()
    config = {
        "task": "vqa",
        "init_from": str(doc_runs["vl-default"]),
        "detector": asdict(EASY_DETECTOR),
        "data": {
            "shards": str(easy.shards),
            "dataset": "vqa-v2",
            "train_questions": str(tmp_path / "q.json"),
            "train_annotations": str(a_file),
            "eval_questions": str(tmp_path / "q.json"),
        },
        "training": {"max_steps": 1, "batch_size": 2, "warmup_steps": 1, "progress_bar": False},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "run"
    line = one_line_error(capsys, "finetune", ["--config", str(tmp_path / "run.yaml"), "--output-dir", str(out)])
    assert line.startswith(
        f"error: {a_file}: not valid JSON for the VQA v2 annotations file (key 'multiple_choice_answer' is given "
        "twice in one object, the object of keys 'question_id', 'multiple_choice_answer', 'answers': the parser "
        "would keep the last silently); "
    ), line
    assert not out.exists() and a_file.read_bytes() == written


def test_a_processor_json_giving_labels_twice_is_refused(capsys, tmp_path, doc_runs):
    run = tmp_path / "vqa"
    shutil.copytree(doc_runs["vqa-easy-vqa"], run)
    record = json.loads((run / "processor.json").read_text())
    text = json.dumps(record, indent=1)
    edited = text[: text.rindex("}")].rstrip() + ',\n "labels": ["yes", "no"]\n}\n'  # a second labels, appended
    (run / "processor.json").write_text(edited)
    line = one_line_error(capsys, "predict", [str(run), "--text", "what shape?", "--image", "photo.png"])
    assert line.startswith(
        f"error: {run / 'processor.json'}: not valid JSON for the processor.json (key 'labels' is given twice in one "
        "object, the object of keys 'processor_class', "
    ), line
    assert "write it again (re-run the conversion or the run that made it)" in line, line
    assert (run / "processor.json").read_text() == edited
