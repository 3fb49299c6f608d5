"""Checkpoints a run resumes from exactly: ``checkpoints/step-N`` holds the model (Hugging Face layout), the
tokenizer, config.yaml and ``training_state.pt`` (optimizer, scheduler, RNGs, data position, the hooks' states);
written in a temporary directory and renamed, so a half-written checkpoint never looks complete."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path

import torch
from accelerate.utils import gather_object

from vlbert import checkpoint as ckpt
from vlbert.run_files import CHECKPOINTS_DIR
from vlbert.training import sharding
from vlbert.training.processes import agree_loaded, agree_on_checkpoint
from vlbert.training.run_directory import record_run_files
from vlbert.training.training_config import seed_process_streams

logger = logging.getLogger(__name__)

STATE_NAME = "training_state.pt"


def _numpy_rng_state() -> dict:
    import numpy as np

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "keys": torch.from_numpy(keys.astype("int64")),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def _set_numpy_rng_state(state: dict) -> None:
    import numpy as np

    np.random.set_state(
        ("MT19937", state["keys"].numpy().astype("uint32"), state["pos"], state["has_gauss"], state["cached_gaussian"])
    )


def process_rng_state(device: torch.device | None = None) -> dict:
    """This process's random streams: Python's, numpy's, torch's CPU generator and, on a CUDA ``device``, that
    device's generator (each rank trains on its own device with its own streams)."""
    state = {"python": list(random.getstate()[1]), "numpy": _numpy_rng_state(), "torch": torch.get_rng_state()}
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_process_rng_state(state: dict, device: torch.device | None = None) -> None:
    """Restore what :func:`process_rng_state` returned (the CUDA stream onto ``device``)."""
    random.setstate((3, tuple(state["python"]), None))
    _set_numpy_rng_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def training_state(trainer, rng_states: list[dict] | None = None) -> dict:
    """Everything besides the weights needed to continue exactly: optimizer, scheduler, every process's random
    streams (``rng``: one :func:`process_rng_state` per rank, ``rng_states`` as gathered by
    :func:`save_checkpoint`; this process's alone when not given), position, and each hook's ``state_dict``
    (keyed by position and class name). A sharded model's optimizer state is gathered whole, in
    ``Optimizer.state_dict``'s layout (:func:`~vlbert.training.sharding.full_optimizer_state`): collective, every
    rank calls it then (its result is the main process's to write)."""
    optimizer = (
        sharding.full_optimizer_state(trainer.unwrapped, trainer._optimizer())
        if trainer.sharded
        else trainer.optimizer.state_dict()
    )
    return {
        "step": trainer.step,
        "epoch": trainer.epoch,
        "batch_in_epoch": trainer.batch_in_epoch,
        "skipped_steps": trainer.skipped_steps,
        "optimizer": optimizer,
        "scheduler": trainer.scheduler.state_dict(),
        "rng": rng_states if rng_states is not None else [process_rng_state(trainer.device)],
        "hooks": {_hook_key(i, hook): hook.state_dict() for i, hook in enumerate(trainer.hooks)},
    }


def _hook_key(index: int, hook) -> str:
    return f"{index}:{type(hook).__name__}"


def save_checkpoint(trainer) -> Path | None:
    """Write ``checkpoints/step-N`` atomically (build in a temporary directory, then rename); keep the newest
    ``save_total_limit``. Every rank gathers its part (random streams, a sharded model's weights and optimizer
    state, the hooks' states); only the main process writes; returns the directory (None elsewhere)."""
    acc = trainer.accelerator
    mine = [process_rng_state(trainer.device)]
    rng_states = gather_object(mine) if acc.num_processes > 1 else mine  # every rank's streams, in rank order
    weights, state = trainer.model_state(), training_state(trainer, rng_states)
    acc.wait_for_everyone()
    if not trainer.is_main:
        return None
    root = trainer.output_dir / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{trainer.step}"
    tmp = root / f".tmp-step-{trainer.step}"
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.save_model(tmp, weights)
    torch.save(state, tmp / STATE_NAME)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    checkpoints = sorted(latest_checkpoints(trainer.output_dir), key=lambda p: int(p.name.split("-")[1]))
    for old in checkpoints[: -trainer.config.save_total_limit] if trainer.config.save_total_limit else []:
        shutil.rmtree(old, ignore_errors=True)
    record_run_files(trainer.output_dir)  # the checkpoints, and the log's lines up to this one, are the run's
    return final


def resume(trainer, checkpoint: Path | None = None) -> bool:
    """Load the newest complete checkpoint of ``trainer.output_dir`` (or ``checkpoint``) into ``trainer``: weights
    (into the float32 shards with bf16 parameters), optimizer, scheduler, position, RNGs and the hooks' states.
    Returns False if there is none. Also truncates ``log.jsonl`` to the checkpoint's step, so the log continues
    as if never interrupted. Several processes first agree on the checkpoint and then on having loaded it
    (:func:`~vlbert.training.processes.agree_on_checkpoint`): no rank trains from another state.

    Raises:
        ProcessGroupError: the ranks found different checkpoints, or another rank could not load it.
    """
    if checkpoint is None:
        found = latest_checkpoints(trainer.output_dir)
        checkpoint = max(found, key=lambda p: int(p.name.split("-")[1])) if found else None
        agree_on_checkpoint(int(checkpoint.name.split("-")[1]) if checkpoint else None, trainer.control)
        if checkpoint is None:
            return False
    error = None
    try:
        _load(trainer, checkpoint)
    except Exception as e:  # noqa: BLE001 - every rank must hear of it before any raises
        error = e
    agree_loaded(error, trainer.control)
    logger.info("resumed from %s at step %d", checkpoint, trainer.step)
    return True


def _load(trainer, checkpoint: Path) -> None:
    weights = ckpt.hf_to_vlbert(ckpt.read_state_dict(checkpoint))
    trainer.unwrapped.load_converted_state_dict(weights, source=str(checkpoint), strict=True)
    state = torch.load(checkpoint / STATE_NAME, map_location="cpu", weights_only=True)
    if trainer.sharded:
        sharding.load_full_optimizer_state(trainer.unwrapped, trainer._optimizer(), state["optimizer"])
    else:
        trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.step, trainer.epoch, trainer.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
    trainer.skipped_steps = state.get("skipped_steps", 0)
    trainer.resumed = True  # the output directory's config.yaml is the run's record: not rewritten (runner.py)
    _restore_rng(trainer, state)
    hooks = state.get("hooks", {})
    for i, hook in enumerate(trainer.hooks):
        if _hook_key(i, hook) in hooks:
            hook.load_state_dict(hooks[_hook_key(i, hook)])
    log = trainer.output_dir / "log.jsonl"
    if trainer.is_main and log.exists():
        kept = [
            line for line in log.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= trainer.step
        ]
        log.write_text("".join(line + "\n" for line in kept))
        record_run_files(trainer.output_dir)  # the log, cut back to the checkpoint, is still the run's


def _restore_rng(trainer, state: dict) -> None:
    """Each process takes back its own random streams; a checkpoint of another number of processes (or of an
    older version, which kept rank 0's) restores rank 0's, then gives each rank its own stream again."""
    acc = trainer.accelerator
    ranks = state.get("rng")
    if ranks is None:  # written before the per-rank streams
        ranks = [
            {
                "python": state["rng_python"],
                "numpy": state.get("rng_numpy", _numpy_rng_state()),
                "torch": state["rng_torch"],
            }
        ]
    if len(ranks) == acc.num_processes:
        set_process_rng_state(ranks[acc.process_index], trainer.device)
        return
    logger.warning(
        "the checkpoint holds the random streams of %d process(es), this run has %d: the run continues "
        "with fresh per-rank streams (not bit-for-bit the run it resumes)",
        len(ranks),
        acc.num_processes,
    )
    set_process_rng_state(ranks[0], trainer.device)
    seed_process_streams(trainer.config.seed + trainer.step, acc.process_index, acc.num_processes)


def latest_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints under ``output_dir/checkpoints`` (those with a training state)."""
    root = Path(output_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    return [p for p in root.glob("step-*") if (p / STATE_NAME).is_file() and p.name.split("-")[1].isdigit()]


__all__ = ["STATE_NAME", "training_state", "save_checkpoint", "resume", "latest_checkpoints"]
