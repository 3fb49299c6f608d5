"""The ``benchmarks`` package (the repository's benchmarks, outside the vlbert wheel): ``python -m benchmarks`` lists
and runs them, every ``tools/benchmark*.py`` script is a thin script over it that runs from any directory, and
tools/benchmark.py still hands ../shared/gpu/roofline.py the BBC News batch it traces."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from helpers.builders import ROOT

import benchmarks
from benchmarks import BENCHMARKS, main, script_arguments


def test_help_lists_every_benchmark_and_each_has_its_parser(capsys):
    assert main(["--help"]) == 0
    usage = capsys.readouterr().out
    assert usage.startswith(f"usage: python -m benchmarks [{'|'.join(BENCHMARKS)}]")
    for name in BENCHMARKS:
        with pytest.raises(SystemExit) as done:
            main([name, "--help"])
        assert done.value.code == 0 and capsys.readouterr().out.startswith("usage: "), name


def test_every_benchmark_script_is_a_thin_script_over_the_package():
    """tools/benchmark.py is the default (train), tools/benchmark_<what>.py the benchmark <what>: one script per
    benchmark, each calling :func:`benchmarks.run_script` with the checkout's root put on sys.path."""
    scripts = sorted(ROOT.joinpath("tools").glob("benchmark*.py"))
    assert {tuple(script_arguments(s)) for s in scripts} == {()} | {(n,) for n in BENCHMARKS if n != "train"}
    for script in scripts:
        text = script.read_text()
        assert "from benchmarks import run_script" in text and "run_script(__file__)" in text, script
    with pytest.raises(KeyError):
        script_arguments("tools/benchmark_no_such.py")
    with pytest.raises(KeyError):
        script_arguments("tools/pretrain.py")


@pytest.mark.integration
def test_a_benchmark_script_runs_from_any_directory_under_the_error_rule(tmp_path):
    """``python tools/benchmark_extraction.py --weights w.pth`` from another directory, without PYTHONPATH: the
    script finds its package, and the benchmark's refusal is one ``error:`` line with status 2 (benchmarks/ is
    code whose checked-input errors are the user's)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "benchmark_extraction.py"), "--weights", "w.pth"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.startswith("error: --weights is one backend's file") and len(done.stderr.splitlines()) == 1


def test_the_old_script_still_hands_the_roofline_proxy_its_batch(monkeypatch):
    """../shared/gpu/roofline.py imports tools/benchmark.py as ``benchmark`` and calls its ``bbc_news_pairs``."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the checkout's root first
    spec = importlib.util.spec_from_file_location("benchmark", ROOT / "tools" / "benchmark.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.bbc_news_pairs is benchmarks.train.bbc_news_pairs
