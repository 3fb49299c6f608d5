"""tools/benchmark.py's --json contract: one line per pair with the keys the issue names, and figures that are
self-consistent (the speedup is the ratio of the two step times, MFU is a fraction, tokens/s follow from ms)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_benchmark_json_lines_are_consistent():
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "benchmark.py"), "--json", "--pairs", "text,vl", "--batch-size", "2",
         "--steps", "2", "--warmup", "1"], capture_output=True, text=True, timeout=600, check=True).stdout
    records = {r["model"]: r for r in map(json.loads, out.strip().splitlines())}
    assert set(records) == {"text", "vl"}
    for r in records.values():
        assert r["speedup"] == r["transformers_ms_per_step"] / r["vlbert_ms_per_step"]
        assert 0 < r["real_tokens"] <= r["batch"][0] * r["batch"][1]
        for impl in ("transformers", "vlbert"):
            assert 0 < r[f"{impl}_mfu"] < 1
            ms = r[f"{impl}_ms_per_step"]
            assert abs(r[f"{impl}_real_tokens_per_s"] - r["real_tokens"] / (ms / 1e3)) < 1e-6 * r["real_tokens"] * 1e3
            assert r[f"{impl}_peak_memory_mib"] >= 0
