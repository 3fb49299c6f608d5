"""``python -m benchmarks extraction`` (benchmarks/extraction.py): every detector backend side by side, a backend that
cannot run given a row saying why, and the flags that do not fit refused in one line."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from benchmarks import main as benchmarks_main
from vlbert.commands import run_tool


@dataclass
class _Options:
    """A toy backend's options (no fields)."""

    def validate(self, weights: str) -> None:
        pass


def _absent_package(options, path):
    raise ModuleNotFoundError("No module named 'absentlib'; pip install absentlib")


def _unbuildable(options, weights, device):
    raise AssertionError("a backend that cannot be set up is never built")


def test_the_extraction_benchmark_times_each_backend_side_by_side_and_says_why_one_did_not_run(monkeypatch, capsys):
    """One run, three backends: timm (tiny input, on small images of two sizes) timed one image at a time and two at a
    time, each a JSON line with positive images/s and the input sizes; a backend whose package is missing (its random
    weights need it, as detectron2's do) and one that writes no random weights each get a row saying why, and the
    run goes on; then the table, one row per (backend, batch) or per backend not run. A detector flag that none of
    the timed backends has is refused in one line."""
    from vlbert.detectors.backends import DETECTOR_BACKENDS, DetectorBackend

    monkeypatch.setitem(
        DETECTOR_BACKENDS, "absent", DetectorBackend(_Options, _unbuildable, (), "toy", random_weights=_absent_package)
    )
    monkeypatch.setitem(DETECTOR_BACKENDS, "norandom", DetectorBackend(_Options, _unbuildable, (), "toy"))
    argv = ["extraction", "--backends", "timm", "absent", "norandom", "--input-size", "64", "--max-proposals", "4"]
    argv += ["--images", "3", "--sizes", "96x72", "72x96", "--batch-size", "2", "--device", "cpu", "--num-workers", "1"]
    assert benchmarks_main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    assert [(r["backend"], r.get("batch_size")) for r in rows] == [
        ("timm", 1),
        ("timm", 2),
        ("absent", None),
        ("norandom", None),
    ]
    for row in rows[:2]:
        assert row["images_per_s"] > 0 and row["ms_per_image"] > 0 and 1 <= row["regions_per_image"] <= 4
        assert row["input_sizes"] == {"96x72": 2, "72x96": 1} and row["images"] == 3 and row["num_workers"] == 1
        assert row["threads"] == torch.get_num_threads() and row["weights"] == "default" and row["device"] == "cpu"
        assert row["detector"].startswith("timm:efficientnet_lite0@64")
    assert rows[2]["error"] == "ModuleNotFoundError: No module named 'absentlib'; pip install absentlib"
    assert "writes no random weights" in rows[3]["error"]
    cells = [[c.strip() for c in line.split(" | ")] for line in lines if " | " in line]
    assert cells[0] == ["backend", "device", "batch", "images/s", "regions/image", "ms/image"]
    assert [row[:3] for row in cells[1:]] == [
        ["timm", "cpu", "1"],
        ["timm", "cpu", "2"],
        ["absent", "cpu", "-"],
        ["norandom", "cpu", "-"],
    ]
    assert all(float(row[3]) > 0 for row in cells[1:3])
    assert cells[3][3].startswith("not run: ModuleNotFoundError") and cells[4][3].startswith("not run: ValueError")

    assert run_tool(benchmarks_main, ["extraction", "--backends", "timm", "--max-boxes", "5"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(
        "error: --max-boxes is an option of the torchvision, butd and detectron2 backends, none of those"
    )


@pytest.mark.parametrize("given", [["--backend", "timm", "--backends", "timm"], ["--weights", "w.pth"]])
def test_the_extraction_benchmark_refuses_flags_that_do_not_fit_in_one_line(given, capsys):
    assert run_tool(benchmarks_main, ["extraction", *given]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and ("--backend X is --backends X" in error or "--weights is one" in error)
