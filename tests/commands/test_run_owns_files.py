"""A run owns what it writes (issue 68, item 1): a run records each file it writes in ``run_files.json`` (name, size,
SHA-256), and ``--overwrite`` replaces only those, as written; a user's file in the run directory, under any name
(their own ``predictions.json``) or a run's file they changed since (notes added to ``metrics.json``), is refused
in one line naming it and the fix, and is byte-identical afterwards, as is everything else there
(docs/bad-input.md row 135)."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers.builders import tool
from helpers.tool_errors import TINY_MODEL, one_line_error

from vlbert.commands import run_tool


@pytest.fixture
def text_config(tmp_path, small_corpus):
    config = {
        "modality": "text",
        "tokenizer": "minilm",
        "model": TINY_MODEL,
        "data": {"corpus": str(small_corpus), "max_seq_length": 64, "corpus_cache_dir": str(tmp_path / "corpora")},
        "training": {"max_steps": 1, "batch_size": 4, "warmup_steps": 1, "progress_bar": False},
    }
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return tmp_path / "tiny.yaml"


def _snapshot(directory):
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_overwrite_replaces_the_runs_own_files_and_refuses_a_users_under_a_run_files_name(
    capsys, tmp_path, text_config
):
    out = tmp_path / "run"
    argv = ["--config", str(text_config), "--output-dir", str(out)]
    assert run_tool(tool("pretrain"), argv) == 0
    recorded = json.loads((out / "run_files.json").read_text())["files"]
    assert {"metrics.json", "model.safetensors", "config.yaml", "log.jsonl", "vocab.txt"} <= set(recorded)
    assert recorded["tensorboard"] == {"directory": True} and len(recorded["metrics.json"]["sha256"]) == 64

    # The user's own predictions.json beside the run (a name runs write; this run did not): neither flag replaces it
    (out / "predictions.json").write_text('{"1": "mine"}\n')
    before = _snapshot(out)
    line = one_line_error(capsys, "pretrain", [*argv, "--overwrite"])
    assert line == (
        f"error: {out} holds a run and files no run wrote (predictions.json); --overwrite replaces a run, never "
        "other files: move them out of the directory, or choose another --output-dir"
    )
    assert _snapshot(out) == before
    line = one_line_error(capsys, "pretrain", [*argv, "--resume", "--max-steps", "2"])
    assert "(predictions.json); --resume continues a run, never other files: move them out" in line, line
    assert _snapshot(out) == before
    (out / "predictions.json").unlink()

    # The run's metrics.json with the user's notes added: no longer the run's file
    metrics = (out / "metrics.json").read_bytes()
    (out / "metrics.json").write_bytes(metrics + b"# my notes\n")
    before = _snapshot(out)
    line = one_line_error(capsys, "pretrain", [*argv, "--overwrite"])
    assert line == (
        f"error: {out / 'metrics.json'} changed since the run wrote it ({len(metrics)} -> {len(metrics) + 11} "
        "bytes) (it is not the file run_files.json records); --overwrite replaces a run, never a file someone "
        "changed: move it out of the directory, or choose another --output-dir"
    )
    assert _snapshot(out) == before

    # The run's own files as it wrote them (its log grown past its last record, as an interrupted run's is):
    # replaced; a hidden file of the user's is left alone
    (out / "metrics.json").write_bytes(metrics)
    with open(out / "log.jsonl", "a") as log:
        log.write('{"split": "train", "step": 2}\n')
    (out / ".my-settings").write_text("keep\n")
    assert run_tool(tool("pretrain"), [*argv, "--overwrite", "--max-steps", "2"]) == 0
    assert json.loads((out / "metrics.json").read_text())["step"] == 2
    assert (out / ".my-settings").read_text() == "keep\n"
