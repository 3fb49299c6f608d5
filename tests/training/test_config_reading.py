"""Config values as users give them, through the one typed reading (vlbert.common/typed_config.py): a value of the
wrong type, out of its range or under an unknown key is one line ``error: ...`` naming the key, what it got and
what it takes, with exit status 2, before anything is built or written (docs/bad-input.md rows 114-116); config
names resolve by one rule for ``--config`` and ``_base_``, the local file first, then the shipped config (row
117); ``--resume`` with a config other than the run's is refused, and the run's config.yaml is never rewritten
(row 118). Every case is a tool's ``main(argv)`` run in-process under ``run_tool``, as ``vlbert <tool>`` runs it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from helpers.builders import tool
from helpers.tool_errors import TINY_MODEL, one_line_error

from vlbert.commands import run_tool
from vlbert.common.typed_config import Range, check_value
from vlbert.recipes import RECIPES
from vlbert.recipes.config_reading import read_run_config, resume_changes
from vlbert.training.checkpointing import STATE_NAME
from vlbert.training.run_config import config_dir, load_run_config


def tiny_text_config(root: Path, corpus: Path, cache_dir: Path) -> Path:
    """A tiny text-pretraining config file (1 step) in ``root`` over ``corpus``, prepared under ``cache_dir``."""
    config = {
        "modality": "text",
        "tokenizer": "minilm",
        "model": TINY_MODEL,
        "data": {
            "corpus": str(corpus),
            "max_seq_length": 64,
            "max_eval_batches": 1,
            "corpus_cache_dir": str(cache_dir),
        },
        "training": {"max_steps": 1, "batch_size": 4, "progress_bar": False},
    }
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def tiny_text(tmp_path_factory, small_corpus):
    """The tiny config of the refusals (which never reach its corpus)."""
    root = tmp_path_factory.mktemp("config-reading")
    return tiny_text_config(root, small_corpus, root / "corpora")


#: case -> (tool, its flags, the key and what it takes, what it got). Text cases run tools/pretrain.py on the tiny
#: config; vqa cases tools/finetune.py --task vqa on its shipped easy-VQA config.
CASES = {
    # data.objectives is a mapping: a list or a single name is refused (not read as names of weight 1: the weights
    # of VL mixes are frequencies, and one spelling is one meaning), with the mapping that works.
    "objectives-list": (
        "text",
        ["--set", "data.objectives=[mlm, nsp]"],
        "data.objectives must be a mapping of objective name to weight",
        "e.g. {mlm: 1, nsp: 1}, got ['mlm', 'nsp']",
    ),
    "objectives-one-name": (
        "text",
        ["--set", "data.objectives=mlm"],
        "data.objectives must be a mapping of objective name to weight",
        "got 'mlm'",
    ),
    "objective-weight": (
        "text",
        ["--set", "data.objectives={mlm: x}"],
        "data.objectives.mlm must be a float",
        "got 'x'",
    ),
    "not-a-boolean": (
        "text",
        ["--set", "model.gradient_checkpointing=ture"],
        "model.gradient_checkpointing must be a bool (true or false)",
        "got 'ture'",
    ),
    "top-level-boolean": (
        "text",
        ["--set", "allow_other_detector=ture"],
        "allow_other_detector must be a bool (true or false)",
        "got 'ture'",
    ),
    "model-range": (
        "text",
        ["--set", "model.hidden_dropout_prob=1.5"],
        "model.hidden_dropout_prob must be a float in [0, 1)",
        "got 1.5",
    ),
    "model-unknown-key": (
        "text",
        ["--set", "model.hiden_size=64"],
        "unknown model config key(s) ['hiden_size']",
        "valid keys are",
    ),
    "training-range": (
        "text",
        ["--set", "training.adam_beta2=1"],
        "training.adam_beta2 must be a float in [0, 1)",
        "got 1",
    ),
    "negative-seed": ("text", ["--seed", "-1"], "training.seed must be an int in [0, 4294967295]", "got -1"),
    "data-range": (
        "text",
        ["--set", "data.mlm_probability=1.5"],
        "data.mlm_probability must be a float in [0, 1]",
        "got 1.5",
    ),
    "not-a-section": ("text", ["--set", "data=bbc-news"], "data must be a mapping of data fields", "got 'bbc-news'"),
    "backbone-by-name": (
        "vqa",
        ["--set", "model.visual_backbone=timm"],
        "model.visual_backbone must be null or a mapping of visual backbone fields",
        "got 'timm'",
    ),
    "frozen-stages-number": (
        "vqa",
        ["--set", "model.visual_backbone={kind: timm, frozen_stages: 2}"],
        "model.visual_backbone.frozen_stages must be a list of the stages to freeze",
        "e.g. [1, 2]; [] for none, got 2",
    ),
    "frozen-stage-zero": (
        "vqa",
        ["--set", "model.visual_backbone={kind: timm, frozen_stages: [0]}"],
        "model.visual_backbone.frozen_stages[0] must be an int >= 1",
        "got 0",
    ),
    "negative-backbone-rate": (
        "vqa",
        ["--set", "model.visual_backbone={kind: timm, learning_rate: -1e-4}"],
        "model.visual_backbone.learning_rate must be null (the run's learning rate) or a float > 0",
        "got -0.0001",
    ),
    "backbone-kind": (
        "vqa",
        ["--set", "model.visual_backbone={kind: resnet}"],
        "model.visual_backbone.kind must be one of 'caffe-resnet', 'torchvision-resnet', 'timm'",
        "got 'resnet'",
    ),
    "backbone-unknown-key": (
        "vqa",
        ["--set", "model.visual_backbone={kind: timm, lr: 1e-5}"],
        "unknown model.visual_backbone key(s) ['lr']",
        "valid keys are",
    ),
    "region-data-range": ("vqa", ["--set", "data.max_regions=0"], "data.max_regions must be an int >= 1", "got 0"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_config_values_are_read_through_their_types(capsys, tmp_path, tiny_text, case):
    task, flags, takes, got = CASES[case]
    out = tmp_path / "out"
    if task == "text":
        argv = ["pretrain", "--config", str(tiny_text)]
    else:
        argv = ["finetune", "--task", "vqa", "--max-steps", "1"]
    line = one_line_error(capsys, argv[0], [*argv[1:], "--output-dir", str(out), *flags])
    assert takes in line and got in line, line
    assert not out.exists()  # refused before the output directory was made
    assert not (tiny_text.parent / "corpora").exists()  # and before any data was built (the corpus prepared)


def test_the_typed_layer_reads_yaml_spellings_and_refuses_what_they_are_not():
    """Property checks of the reading itself: YAML 1.1's number strings are numbers, whole floats are counts,
    unquoted no/off read as the word a Literal expects; bools, fractions and NaN are refused."""
    from typing import Annotated, Literal

    assert check_value("1e-4", float, "k") == 1e-4 and check_value("10", int, "k") == 10
    assert check_value(10.0, int, "k") == 10 and type(check_value(10.0, int, "k")) is int
    assert check_value(False, Literal["auto", "no"], "k") == "no"
    assert check_value({"mlm": "2"}, dict[str, float], "k") == {"mlm": 2.0}
    for value, tp, message in (
        (True, int, "k must be an int, got True"),
        (1.5, int, "k must be an int, got 1.5"),
        ("yes", bool, "k must be a bool (true or false), got 'yes'"),
        (float("nan"), Annotated[float, Range(ge=0)], "k must be a float >= 0, got nan"),
        ([1, "x"], list[int], r"k\[1\] must be an int, got 'x'"),
        (True, str, "k must be a string, got True"),
    ):
        with pytest.raises(ValueError, match=message if "[" in message else re.escape(message)):
            check_value(value, tp, "k")


def test_config_names_resolve_local_file_first_then_shipped(capsys, tmp_path, monkeypatch):
    """--config text/default uses ./text/default.yaml where it exists (the shipped one otherwise), and
    ``_base_: text/default`` in a user's own file is the shipped config, as in an installed vlbert whose package
    has no configs/ folder beside the working directory; a name that is neither is one line that names `vlbert
    configs`, not a folder an installed vlbert does not have."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "default.yaml").write_text("modality: text\ntraining: {max_stepz: 1}\n")
    line = one_line_error(
        capsys, "pretrain", ["--config", "text/default", "--output-dir", str(tmp_path / "a"), "--max-steps", "1"]
    )
    assert "unknown training config key(s) ['max_stepz']" in line  # the local file was read, not the shipped one

    (tmp_path / "mine.yaml").write_text("_base_: text/default\ntraining: {max_steps: 3}\n")
    assert load_run_config("mine.yaml")["training"] == {"max_stepz": 1, "max_steps": 3}  # the same rule: local
    (tmp_path / "text" / "default.yaml").unlink()  # without the local file, the name is the shipped config
    shipped = load_run_config(config_dir() / "text" / "default.yaml")
    assert load_run_config("text/default") == shipped
    assert load_run_config("mine.yaml") == {**shipped, "training": {**shipped["training"], "max_steps": 3}}
    assert (
        run_tool(
            tool("pretrain"),
            ["--config", "mine.yaml", "--output-dir", str(tmp_path / "c"), "--set", "training.max_steps=0"],
        )
        == 2
    )  # read, then refused: max_steps
    assert "training.max_steps must be an int >= 1, got 0" in capsys.readouterr().err
    (tmp_path / "typo.yaml").write_text("_base_: text/nosuch\n")
    line = one_line_error(capsys, "pretrain", ["--config", "typo.yaml", "--output-dir", str(tmp_path / "b")])
    assert "text/nosuch is not the name of a shipped config (`vlbert configs` lists them)" in line
    assert "included by typo.yaml" in line and "see configs/" not in line


def test_resume_refuses_a_changed_config_and_never_rewrites_config_yaml(
    capsys, tmp_path, small_corpus, small_token_corpus
):
    """A run of 2 steps with a checkpoint each step; --resume with data.objectives edited is refused in one line
    naming the key and both values, nothing in the run touched; --resume with a longer --max-steps (a change a
    resumed run may make) continues, keeps config.yaml byte for byte and records the change in log.jsonl."""
    # the session's prepared small corpus: not tokenised again
    tiny = tiny_text_config(tmp_path, small_corpus, small_token_corpus.directory.parent)
    out = tmp_path / "run"
    common = ["--config", str(tiny), "--output-dir", str(out), "--save-every", "1", "--log-every", "1"]
    argv = [*common, "--max-steps", "2"]
    assert run_tool(tool("pretrain"), argv) == 0
    recorded = (out / "config.yaml").read_bytes()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    line = one_line_error(capsys, "pretrain", [*argv, "--resume", "--set", "data.objectives={mlm: 1}"])
    assert "--resume: this config differs from the one the run" in line
    assert "data.objectives: {'mlm': 1, 'nsp': 1} -> {'mlm': 1}" in line, line
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing touched

    # A finished run resumed as it was: refused, nothing retrained or rewritten (it retrained step 2).
    line = one_line_error(capsys, "pretrain", [*argv, "--resume"])
    assert "--resume: the run in" in line and "finished at step 2" in line and "raise --max-steps" in line, line
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before

    assert run_tool(tool("pretrain"), [*common, "--max-steps", "3", "--resume"]) == 0
    assert (out / "config.yaml").read_bytes() == recorded
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["split"] == "train"] == [1, 2, 3]
    assert {"split": "config", "step": 1, "changed": {"training.max_steps": [2, 3]}} in log  # resumed at step 1
    # the checkpoints written after the resume record the config they were trained with
    assert yaml.safe_load((out / "checkpoints" / "step-2" / "config.yaml").read_text())["training"]["max_steps"] == 3


def test_a_renamed_key_is_refused_in_a_config_and_read_in_a_resumed_runs_record(tmp_path):
    """data.task, text fine-tuning's data reader until it became data.dataset as every task's (issue 64): a config
    that gives it is refused in one line naming the new key; a run's config.yaml written before the rename (never
    rewritten) is read under today's name, so --resume of that run compares its data reader as the same."""
    text = RECIPES["text"]
    with pytest.raises(
        ValueError, match=r"^data.task is now data.dataset: rename it in the config \(data.dataset: glue\)$"
    ):
        read_run_config(text, {"task": "text", "data": {"task": "glue"}})
    config = {
        "task": "text",
        "data": {"dataset": "bbc-news", "max_seq_length": 32},
        "training": {"output_dir": str(tmp_path), "max_steps": 4},
    }
    recorded = {**config, "data": {"task": "bbc-news", "max_seq_length": 32}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(recorded))
    (tmp_path / "checkpoints" / "step-2").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-2" / STATE_NAME).write_bytes(b"")
    assert resume_changes(text, config, tmp_path) == {}
    with pytest.raises(ValueError, match="data.dataset: 'bbc-news' -> 'glue'"):
        resume_changes(text, {**config, "data": {"dataset": "glue", "max_seq_length": 32}}, tmp_path)
