"""``python -m benchmarks inference`` (benchmarks/inference.py): images/s of a VQA run's pipeline from image files."""

from __future__ import annotations

import json
import sys

from benchmarks import run_script


def test_smoke_inference_benchmark_prints_its_figures(doc_runs, monkeypatch, capsys):
    """``tools/benchmark_inference.py RUN --json`` on a tiny VQA run (the docs' untrained one, with the `easy`
    fixture's detector): one JSON object whose figures count the images asked for, at a positive speed."""
    argv = [str(doc_runs["vqa-easy-vqa"]), "--images", "4", "--batch-size", "2", "--json"]
    monkeypatch.setattr(sys, "argv", ["benchmark_inference.py", *argv])
    assert run_script("tools/benchmark_inference.py") == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["images"] == 4 and figures["end_to_end_images_per_s"] > 0
