"""The multi-process tests' shared pieces: a free port, a tiny text-pretraining config, the losses a run logged, the
single-process reference run, and :func:`launch`, torch's elastic launcher (torchrun's agent) starting its workers by
fork from this already-imported process (:func:`agent_config`, :func:`forked`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import uuid
from pathlib import Path

from helpers.builders import like_a_worker


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
    """What a :func:`launch` worker does (float64, one thread), alone in this process: the single-process side of a
    comparison, or a resume that is not itself under test."""
    from vlbert.recipes import RECIPES, run

    with like_a_worker(float64=True):
        run(RECIPES[recipe], run_config, resume=resume)


def as_a_new_process() -> None:
    """What a forked worker must not inherit from this process: accelerate's process state (a single-process run
    here made it; a new process under a launcher reads its rank and world size from the environment), and this
    process's threads (one, as ``OMP_NUM_THREADS=1``)."""
    import torch
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    torch.set_num_threads(1)
    os.environ.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")


def _fresh_entrypoint(entrypoint, *args):
    as_a_new_process()
    return entrypoint(*args)


def _forked_worker(rank: int, worker, *args) -> None:
    as_a_new_process()
    worker(rank, *args)


def _run_in_worker(runs: list, float64: bool) -> None:
    """One forked worker (one thread, float64 by default, as :func:`reference_run`), every run in turn.
    ``runs``: ``[recipe, run config]`` or ``[recipe, run config, resume]``."""
    import torch

    if float64:
        torch.set_default_dtype(torch.float64)
    from vlbert.recipes import RECIPES, run

    for name, run_config, *resume in runs:
        run(RECIPES[name], run_config, resume=bool(resume and resume[0]))


def launch(runs: list, nproc: int = 2, float64: bool = True, entrypoint=None, args: tuple = ()) -> dict:
    """Run ``runs`` (``[recipe, run config(, resume)]`` each, in turn) on ``nproc`` processes as torchrun does:
    torch's elastic agent (:func:`torch.distributed.launcher.api.elastic_launch`, what ``torchrun`` runs) with a
    c10d rendezvous on a free port, setting RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, ... for each worker.
    The workers are forked from this process, which has imported torch, transformers and vlbert already: a
    torchrun launch costs each worker an interpreter's start and those imports (4-9 s of CPU each on 2-core VMs),
    which was most of the distributed tests' time. What this leaves untested is torchrun's own command-line parsing
    (torch's); the two-node tests run two such agents in forked node processes (tests/training/test_multinode.py).
    ``entrypoint(*args)`` replaces the runs where given (a tool's ``main``: tests/regions/test_extraction.py).
    Returns each rank's return value; a failed worker raises torch's ``ChildFailedError`` with its traceback. This
    process's signal handlers (which the agent replaces) are restored after."""
    from torch.distributed.launcher.api import elastic_launch

    import vlbert.recipes  # noqa: F401  (imported once here, not in every worker)

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    if entrypoint is None:
        entrypoint, args = _run_in_worker, (runs, float64)
    try:
        return elastic_launch(agent_config(nproc), _fresh_entrypoint)(entrypoint, *args)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


def agent_config(nproc: int, nodes: int = 1, endpoint: str | None = None, run_id: str | None = None):
    """torch's elastic agent's ``LaunchConfig`` as ``torchrun --nnodes <nodes> --nproc_per_node <nproc>
    --rdzv_backend c10d --rdzv_endpoint <endpoint> --max_restarts 0`` makes it (a free port on 127.0.0.1 when no
    ``endpoint`` is given), its workers forked."""
    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(
        min_nodes=nodes,
        max_nodes=nodes,
        nproc_per_node=nproc,
        run_id=run_id or uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint=endpoint or f"127.0.0.1:{free_port()}",
        max_restarts=0,
        monitor_interval=0.05,
        start_method="fork",
    )


def forked(worker, *args, nproc: int = 2) -> None:
    """``worker(rank, *args)`` on ``nproc`` processes forked from this one (torch.multiprocessing, as ``mp.spawn``
    but without each process's interpreter start and imports); the workers set up their own process group. A
    failed worker raises ``ProcessRaisedException`` with its traceback."""
    import torch.multiprocessing as mp

    import vlbert.recipes  # noqa: F401  (imported once here, not in every worker)

    mp.start_processes(_forked_worker, args=(worker, *args), nprocs=nproc, join=True, start_method="fork")
