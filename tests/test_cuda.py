"""On a CUDA GPU (skipped without one): a few steps of text and VL pretraining through the real trainer in bf16
give finite per-step losses equal to the CPU float32 run of the same config within bf16's tolerance.

The CPU reference runs in a child process with ``CUDA_VISIBLE_DEVICES`` empty (the trainer takes the GPU whenever
one is visible); dropout is off so both runs compute the same function on the same batches and masks (drawn on the
host from per-sample seeds)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[1]
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
STEPS = 4


def train_losses(out: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if r["split"] == "train"]


def cpu_reference(config: dict, out: Path) -> list[float]:
    """The same run in float32 on the CPU, in a child process that sees no GPU."""
    path = out.with_suffix(".yaml")
    import yaml

    path.write_text(yaml.safe_dump({**config, "training": {**config["training"], "output_dir": str(out),
                                                            "mixed_precision": "no"}}))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "pretrain.py"), "--modality", config["modality"],
                           "--config", str(path)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return train_losses(out)


def assert_close_in_bf16(gpu: list[float], cpu: list[float]) -> None:
    assert len(gpu) == len(cpu) == STEPS
    assert all(math.isfinite(x) for x in gpu)
    for g, c in zip(gpu, cpu):
        assert abs(g - c) <= 0.03 * abs(c) + 0.02, (gpu, cpu)  # bf16 keeps 8 bits of mantissa


def test_text_pretraining_in_bf16_on_cuda_equals_cpu_float32(small_corpus, tmp_path):
    from vlbert.recipes import RECIPES, run

    config = {"modality": "text", "tokenizer": "minilm",
              "model": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128,
                        "max_position_embeddings": 64, **NO_DROPOUT},
              "data": {"corpus": str(small_corpus), "max_seq_length": 64, "eval_fraction": 0.0,
                       "corpus_cache_dir": str(tmp_path / "corpora")},
              "training": {"max_steps": STEPS, "batch_size": 8, "learning_rate": 1e-3, "warmup_steps": 1,
                           "log_every": 1, "progress_bar": False, "num_workers": 0}}
    cpu = cpu_reference(config, tmp_path / "cpu")
    run(RECIPES["text-pretraining"], {**config, "training": {**config["training"], "output_dir": str(tmp_path / "gpu"),
                                                              "mixed_precision": "bf16"}})
    assert_close_in_bf16(train_losses(tmp_path / "gpu"), cpu)


def test_vl_pretraining_in_bf16_on_cuda_equals_cpu_float32(tmp_path):
    from vlbert.recipes import RECIPES, run

    config = {"modality": "vl", "tokenizer": "minilm",
              "model": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128,
                        **NO_DROPOUT},
              "detector": {"input_size": 96, "max_proposals": 16},
              "data": {"max_images": 48, "cache_dir": str(tmp_path / "regions"), "eval_fraction": 0.25,
                       "objectives": {"mlm": 1, "mrfr": 1, "mrc_kl": 1, "itm": 1}},
              "training": {"max_steps": STEPS, "batch_size": 8, "learning_rate": 1e-3, "warmup_steps": 1,
                           "log_every": 1, "progress_bar": False, "num_workers": 0}}
    cpu = cpu_reference(config, tmp_path / "cpu")  # extracts the regions into the shared cache first
    run(RECIPES["vl-pretraining"], {**config, "training": {**config["training"], "output_dir": str(tmp_path / "gpu"),
                                                            "mixed_precision": "bf16"}})
    assert_close_in_bf16(train_losses(tmp_path / "gpu"), cpu)
