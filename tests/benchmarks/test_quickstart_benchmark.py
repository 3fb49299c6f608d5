"""``python -m benchmarks quickstart`` (benchmarks/quickstart.py): the README's quick start re-run and timed, each
repeat from a clean directory and a cold cache."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks import main as benchmarks_main
from benchmarks import quickstart


def test_the_quickstart_benchmark_runs_each_repeat_clean_and_reports_min_median_max(monkeypatch, tmp_path, capsys):
    """`python -m benchmarks quickstart --commands vqa --repeats 2`: each repeat in a new directory with its own cache,
    the ``vl`` run that ``vqa`` needs made first and left out of the figures, the README's command lines with only
    the cache moved; one table row with the runs' min / median / max. (The child processes are stood in for.)"""
    calls = []

    def fake_run(argv, cwd, **kwargs):
        calls.append((Path(cwd), argv[3:]))
        return subprocess.CompletedProcess(argv, 0, stdout=f"ran {argv[3]}\n")

    monkeypatch.setattr(quickstart.subprocess, "run", fake_run)
    assert (
        benchmarks_main(
            ["quickstart", "--commands", "vqa", "--repeats", "2", "--workdir", str(tmp_path), "--show-output"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert [argv[:2] for _, argv in calls] == [["pretrain", "--modality"], ["finetune", "--task"]] * 2
    first, second = calls[0][0], calls[2][0]
    assert first != second and calls[1][0] == first and not first.exists()  # a clean directory each, removed
    assert calls[1][1] == [
        "finetune",
        "--task",
        "vqa",
        "--dataset",
        "easy-vqa",
        "--init-from",
        "runs/vl-default",
        "--set",
        f"data.cache_dir={first / 'cache'}/regions",
    ]
    [header, rule, row, *rest] = out.splitlines()
    assert header.split()[:5] == ["command", "runs", "min", "median", "max"] and set(rule) <= {"-", " "}
    assert (
        row.split()[:5] == ["vqa", "2", "0:00", "0:00", "0:00"] and "ran finetune" in out and "ran pretrain" not in out
    )


def test_a_missing_workdir_is_refused_naming_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        quickstart.main(["--workdir", str(tmp_path / "nowhere"), "--repeats", "1"])
    assert stopped.value.code == 2
    assert f"--workdir {tmp_path / 'nowhere'} is not a directory: create it" in capsys.readouterr().err
