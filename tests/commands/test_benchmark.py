"""The benchmark's model-FLOPs estimate (the numerator of every MFU it prints) against PyTorch's own count of
the matmul FLOPs of a real forward pass; ``vlbert benchmark extraction``'s backends side by side."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from vlbert import BertConfig, BertForPreTraining


def test_flops_estimate_equals_counted_forward_flops():
    from vlbert.training.mfu import estimate_flops_per_token

    # A vocabulary of a multiple of 64: the MLM head pads others to one (MaskedLMHead.vocab_multiple), and the
    # padded rows' FLOPs are work the model does but the estimate (useful FLOPs) leaves out.
    config = BertConfig(
        vocab_size=320,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    # Training mode on CPU: attention runs as two counted matmuls (the CPU dropout path); SDPA's fused CPU
    # kernel is not counted by FlopCounterMode.
    model = BertForPreTraining(config).train()
    batch, seq_len = 4, 40
    ids = torch.randint(5, 300, (batch, seq_len))
    labels = torch.full_like(ids, -100)
    labels[:, :6] = ids[:, :6]  # 6 of 40 positions = the estimate's 15% masked fraction
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(ids, labels=labels, next_sentence_label=torch.zeros(batch, dtype=torch.long))
    estimated_forward = estimate_flops_per_token(config, seq_len) / 3 * batch * seq_len
    assert abs(counter.get_total_flops() - estimated_forward) <= 1e-9 * estimated_forward


def test_measuring_the_peak_leaves_the_global_random_generator_alone():
    """The trainer measures the CPU matmul peak at its first log line: drawing from the global generator there moved
    every later dropout mask, and a resumed run (which measures at another step) no longer matched."""
    from vlbert.training.mfu import measure_matmul_peak

    torch.manual_seed(0)
    state = torch.get_rng_state()
    assert measure_matmul_peak(torch.device("cpu"), torch.float32, size=64, repeats=1, trials=1) > 0
    assert torch.equal(torch.get_rng_state(), state)


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

    from vlbert.commands import run_tool
    from vlbert.commands.benchmark import main as benchmark_main

    monkeypatch.setitem(
        DETECTOR_BACKENDS, "absent", DetectorBackend(_Options, _unbuildable, (), "toy", random_weights=_absent_package)
    )
    monkeypatch.setitem(DETECTOR_BACKENDS, "norandom", DetectorBackend(_Options, _unbuildable, (), "toy"))
    argv = ["extraction", "--backends", "timm", "absent", "norandom", "--input-size", "64", "--max-proposals", "4"]
    argv += ["--images", "3", "--sizes", "96x72", "72x96", "--batch-size", "2", "--device", "cpu", "--num-workers", "1"]
    assert benchmark_main(argv) == 0
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

    assert run_tool(benchmark_main, ["extraction", "--backends", "timm", "--max-boxes", "5"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(
        "error: --max-boxes is an option of the torchvision, butd and detectron2 backends, none of those"
    )


@pytest.mark.parametrize("given", [["--backend", "timm", "--backends", "timm"], ["--weights", "w.pth"]])
def test_the_extraction_benchmark_refuses_flags_that_do_not_fit_in_one_line(given, capsys):
    from vlbert.commands import run_tool
    from vlbert.commands.benchmark import main as benchmark_main

    assert run_tool(benchmark_main, ["extraction", *given]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and ("--backend X is --backends X" in error or "--weights is one" in error)
