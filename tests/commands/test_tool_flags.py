"""The tools' flags and the files they are handed, as a user meets them (issue 68, items 1, 4 and 5): counts and
steps of at least 1, devices this machine has, no misspelt benchmark run as another, no flag that cannot apply,
a warm-up longer than the run warned of in one line, a YAML section given twice, a hand-edited processor.json, and
``--overwrite`` beside a user's file: each one line, nothing written or replaced (docs/bad-input.md rows 129-133)."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import yaml
from helpers.tool_errors import TINY_MODEL, one_line_error

from benchmarks import main as benchmarks_main
from vlbert.commands import run_tool


def _argparse_error(capsys, main, argv) -> str:
    """The last line argparse writes when it refuses ``argv`` (status 2)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_tool(main, argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["train", "--steps", "0"], "argument --steps: must be an integer >= 1, got 0"),
        (["visual-backbone", "--batch-size", "-2"], "argument --batch-size: must be an integer >= 1, got -2"),
        (["region-store", "--images", "10", "0"], "argument --images: must be an integer >= 1, got 0"),
        (["inference", "runs/x", "--device", "cuda:7"], "argument --device: cuda:7 is not available"),
        (["inference", "runs/x", "--device", "gpu"], "argument --device: 'gpu' is not a device name"),
    ],
    ids=["steps-0", "batch-negative", "images-0", "missing-cuda", "not-a-device"],
)
def test_benchmark_counts_and_devices_are_checked_as_the_flags_are_read(capsys, argv, expected):
    assert expected in _argparse_error(capsys, benchmarks_main, argv)


def test_a_misspelt_benchmark_is_refused_not_run_as_another(capsys):
    capsys.readouterr()
    assert run_tool(benchmarks_main, ["trian", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown benchmark 'trian'; did you mean train? the benchmarks are train, "), err
    assert "\n" not in err


def test_example_image_refuses_a_colour_with_an_id_and_predict_a_missing_device(capsys, tmp_path, doc_runs):
    from vlbert.commands.example_image import main as example_image
    from vlbert.commands.predict import main as predict

    out = tmp_path / "photo.png"
    capsys.readouterr()
    assert run_tool(example_image, [str(out), "--id", "test/0", "--color", "red"]) == 2
    line = capsys.readouterr().err.strip()
    assert line == "error: --color chooses an image and --id names one: give --id alone, or --color without --id"
    assert not out.exists()

    line = _argparse_error(capsys, predict, [str(doc_runs["text-default"]), "--text", "x", "--device", "cuda:7"])
    assert "argument --device: cuda:7 is not available" in line, line


def test_a_hand_edited_processor_json_is_refused_naming_the_field(capsys, tmp_path, doc_runs):
    run = tmp_path / "vqa"
    shutil.copytree(doc_runs["vqa-easy-vqa"], run)
    record = json.loads((run / "processor.json").read_text())
    record["labels"] = {str(k): label for k, label in enumerate(record["labels"])}  # edited into id -> label
    (run / "processor.json").write_text(json.dumps(record))
    argv = [str(run), "--text", "what shape?", "--image", "photo.png"]
    line = one_line_error(capsys, "predict", argv)
    assert f"error: {run / 'processor.json'}: field 'labels' must be a list of the label names in logit order" in line
    assert "write the labels as a list in logit order (the mapping's values, ordered by id)" in line, line
    record["labels"], record["max_regions"] = list(record["labels"].values()), "many"
    (run / "processor.json").write_text(json.dumps(record))
    line = one_line_error(capsys, "predict", argv)
    assert "field 'max_regions' must be null or an int >= 1, got 'many'" in line, line


@pytest.fixture
def text_config(tmp_path, small_corpus):
    """A tiny text-pretraining config (training.warmup_steps left at its default, 100, over max_steps 1)."""
    config = {
        "modality": "text",
        "tokenizer": "minilm",
        "model": TINY_MODEL,
        "data": {"corpus": str(small_corpus), "max_seq_length": 64},
        "training": {"max_steps": 1, "batch_size": 4, "progress_bar": False},
    }
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return tmp_path / "tiny.yaml"


def test_a_yaml_section_given_twice_is_refused(capsys, tmp_path, text_config):
    twice = tmp_path / "twice.yaml"
    twice.write_text(text_config.read_text() + "training:\n  max_steps: 5\n")
    line = one_line_error(capsys, "pretrain", ["--config", str(twice), "--output-dir", str(tmp_path / "out")])
    assert f"error: {twice}:" in line and "key 'training' is given twice (first at line" in line, line
    assert not (tmp_path / "out").exists()


def test_overwrite_replaces_a_run_never_a_users_file_and_a_long_warmup_is_warned_of(
    capsys, caplog, tmp_path, text_config
):
    out = tmp_path / "out"
    out.mkdir()
    (out / "log.jsonl").write_text('{"split": "train", "step": 1}\n')  # a run's
    (out / "notes.txt").write_text("my notes\n")  # the user's
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with caplog.at_level(logging.WARNING):
        line = one_line_error(
            capsys, "pretrain", ["--config", str(text_config), "--output-dir", str(out), "--overwrite"]
        )
    assert line == (
        f"error: {out} holds a run and files no run wrote (notes.txt); --overwrite replaces a run, never other files: "
        "move them out of the directory, or choose another --output-dir"
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    warned = [r.getMessage() for r in caplog.records if "warmup_steps" in r.getMessage()]
    assert warned == [
        "training.warmup_steps (100) is larger than training.max_steps (1): the learning rate never reaches "
        "training.learning_rate (it peaks at 1% of it); lower it, e.g. --set training.warmup_steps=1"
    ]


def test_convert_and_train_tokenizer_never_replace_a_users_file(capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "vocab.txt").write_text("[PAD]\nmine\n")
    (out / "predictions.json").write_text("{}\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    source = tmp_path / "uniter.pt"
    source.write_bytes(b"not read: refused before")
    argv = ["--from", "uniter", str(source), "--output-dir", str(out), "--overwrite"]
    line = one_line_error(capsys, "convert_checkpoint", argv)
    assert line == (
        f"error: {out} holds files that are not a converted model's (predictions.json); --overwrite replaces a model "
        "directory, never other files: choose another --output-dir"
    )
    line = one_line_error(capsys, "train_tokenizer", ["--corpus", str(source), "--output-dir", str(out)])
    assert (
        line
        == f"error: {out} already holds vocab.txt; train-tokenizer never replaces a file: choose another --output-dir"
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
