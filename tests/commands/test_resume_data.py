"""``--resume`` checks the data (issue 68, item 2): a run records what it trained on in ``trained_on.json`` (each
data file's size and SHA-256, the answer vocabulary in order), and a resume on other data is one ``error:`` line
naming what changed and the fix, with nothing in the run directory changed (docs/bad-input.md row 126); data given as a
directory (region shards, a text corpus folder) is recorded file by file, and a changed file of it named (row 136)."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict

import yaml
from helpers.builders import EASY_DETECTOR, tool
from helpers.tool_errors import TINY_MODEL, one_line_error

from vlbert.commands import run_tool


def _files(root, name: str, questions: list[tuple[int, str, str]]):
    """VQA v2 questions and annotations files of ``questions`` (question id, image id in `easy`, the answer of
    all ten annotators)."""
    qs = [{"question_id": q, "image_id": int(image), "question": f"question {q}?"} for q, image, _ in questions]
    anns = [
        {
            "question_id": q,
            "image_id": int(image),
            "multiple_choice_answer": answer,
            "answers": [{"answer": answer, "answer_id": k + 1} for k in range(10)],
        }
        for q, image, answer in questions
    ]
    (root / f"{name}_questions.json").write_text(json.dumps({"questions": qs}))
    (root / f"{name}_annotations.json").write_text(json.dumps({"annotations": anns}))
    return root / f"{name}_questions.json", root / f"{name}_annotations.json"


def _snapshot(directory):
    return {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_resume_refuses_a_reordered_answer_vocabulary_and_an_edited_data_file(capsys, tmp_path, easy, doc_runs):
    train = [(1, "0", "yes"), (2, "1", "yes"), (3, "2", "no"), (4, "3", "blue")]
    q_train, a_train = _files(tmp_path, "train", train)
    q_eval, a_eval = _files(tmp_path, "val", [(11, "4", "yes"), (12, "5", "no")])
    config = {
        "task": "vqa",
        "init_from": str(doc_runs["vl-default"]),
        "detector": asdict(EASY_DETECTOR),
        "data": {
            "dataset": "vqa-v2",
            "shards": str(easy.shards),
            "min_answer_count": 1,
            "train_questions": str(q_train),
            "train_annotations": str(a_train),
            "eval_questions": str(q_eval),
            "eval_annotations": str(a_eval),
        },
        "training": {"batch_size": 2, "warmup_steps": 1, "progress_bar": False, "save_every": 1},
    }
    (tmp_path / "vqa.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "run"
    argv = ["--config", str(tmp_path / "vqa.yaml"), "--output-dir", str(out)]
    assert run_tool(tool("finetune"), [*argv, "--max-steps", "1"]) == 0
    recorded = json.loads((out / "trained_on.json").read_text())
    assert recorded["labels"] == json.loads((out / "processor.json").read_text())["labels"] == ["yes", "blue", "no"]
    files = {f"data.{k}_{f}" for k in ("train", "eval") for f in ("questions", "annotations")}
    assert set(recorded["files"]) == {*files, "data.shards"} and recorded["files"]["data.shards"]["directory"]
    before = _snapshot(out)

    # Two answers swapped between the questions: "no" is now the more frequent, so the vocabulary's order changes
    _files(tmp_path, "train", [(1, "0", "no"), (2, "1", "no"), (3, "2", "yes"), (4, "3", "blue")])
    line = one_line_error(capsys, "finetune", [*argv, "--max-steps", "2", "--resume"])
    assert "--resume: the task's labels (the answer vocabulary" in line and str(a_train) in line, line
    assert "2 reordered: 'yes', 'no'" in line and "start a new run with --output-dir NEW" in line, line
    assert _snapshot(out) == before

    # The vocabulary kept, a held-out file edited: named with its key
    _files(tmp_path, "train", train)
    _files(tmp_path, "val", [(11, "4", "yes"), (12, "5", "on")])  # same size
    line = one_line_error(capsys, "finetune", [*argv, "--max-steps", "2", "--resume"])
    assert f"--resume: data.eval_annotations ({a_eval}) changed since the run started (its bytes differ)" in line
    assert _snapshot(out) == before

    # The original files back: the resume continues
    _files(tmp_path, "val", [(11, "4", "yes"), (12, "5", "no")])
    assert run_tool(tool("finetune"), [*argv, "--max-steps", "2", "--resume"]) == 0
    assert json.loads((out / "metrics.json").read_text())["step"] == 2


def test_resume_refuses_a_changed_data_directory_naming_the_files(capsys, tmp_path, small_corpus):
    """A corpus given as a directory (as region shards and image folders are) is recorded file by file: a file of it
    rewritten at the same size, or one added, is refused naming the directory's key and the files."""
    corpus = tmp_path / "corpus"
    shutil.copytree(small_corpus, corpus)
    config = {
        "modality": "text",
        "tokenizer": "minilm",
        "model": TINY_MODEL,
        "data": {"corpus": str(corpus), "max_seq_length": 64, "corpus_cache_dir": str(tmp_path / "corpora")},
        "training": {"batch_size": 4, "warmup_steps": 1, "save_every": 1, "progress_bar": False},
    }
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "run"
    argv = ["--config", str(tmp_path / "tiny.yaml"), "--output-dir", str(out)]
    assert run_tool(tool("pretrain"), [*argv, "--max-steps", "1"]) == 0
    recorded = json.loads((out / "trained_on.json").read_text())["files"]["data.corpus"]
    assert (
        recorded["directory"]
        and recorded["files"] == len(list(corpus.iterdir()))
        and "corpora" not in json.dumps(recorded)
    )
    before = _snapshot(out)

    first = sorted(corpus.iterdir())[0]
    text = first.read_bytes()
    first.write_bytes(text.decode()[::-1].encode())  # the same size, other bytes
    line = one_line_error(capsys, "pretrain", [*argv, "--max-steps", "2", "--resume"])
    assert line == (
        f"error: --resume: data.corpus ({corpus}) changed since the run started (1 changed: {first.name}); "
        "resume with the original files, or start a new run with --output-dir NEW"
    )
    assert _snapshot(out) == before
    first.write_bytes(text)
    (corpus / "zz-new.txt").write_text("Another article about the markets.\n")
    line = one_line_error(capsys, "pretrain", [*argv, "--max-steps", "2", "--resume"])
    assert f"data.corpus ({corpus}) changed since the run started (1 new: zz-new.txt)" in line, line
    assert _snapshot(out) == before

    (corpus / "zz-new.txt").unlink()
    assert run_tool(tool("pretrain"), [*argv, "--max-steps", "2", "--resume"]) == 0
    assert json.loads((out / "metrics.json").read_text())["step"] == 2
