"""The multi-process tests' shared pieces: a free port, a tiny text-pretraining config, the losses a run logged, the single-process reference run and the workers' environment."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from helpers.builders import like_a_worker

HERE = Path(__file__).resolve().parent  # tests/helpers: ddp_worker.py
ROOT = HERE.parents[1]
DDP_WORKER = HERE / "ddp_worker.py"  # one process of a torchrun comparison


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(corpus, out, batch_size, steps=6, **training):
    return {
        "modality": "text",
        "tokenizer": "minilm",
        "model": {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
        },
        "data": {
            "corpus": str(corpus),
            "max_seq_length": 64,
            "eval_fraction": 0.0,
            "corpus_cache_dir": str(Path(out).parent / "corpora"),
        },
        "training": {
            "output_dir": str(out),
            "max_steps": steps,
            "batch_size": batch_size,
            "learning_rate": 1e-3,
            "warmup_steps": 1,
            "log_every": 1,
            "progress_bar": False,
            **training,
        },
    }


def losses(out: Path) -> dict[int, float]:
    return {
        r["step"]: r["loss"]
        for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())
        if r["split"] == "train"
    }


def reference_run(run_config: dict, recipe: str = "text-pretraining", resume: bool = False) -> None:
    """What ``ddp_worker.py`` does alone (float64, one thread), in this process: the single-process side of a
    comparison, or a resume that is not itself under test."""
    from vlbert.recipes import RECIPES, run

    with like_a_worker(float64=True):
        run(RECIPES[recipe], run_config, resume=resume)


def env():
    # PYTHONPATH extended, not replaced: a machine may need what it holds. CUDA_VISIBLE_DEVICES empty: these
    # compare CPU float32 runs (gloo), whatever GPUs the machine has.
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
