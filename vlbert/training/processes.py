"""Several processes on one or several machines: starting them, and the host-side agreements that keep them in
step (the output directory every rank sees, the checkpoint they resume, the step at which SIGTERM stops them).

The process group is torch.distributed's, started by accelerate (NCCL on GPUs, gloo on CPUs) with a bounded
``timeout`` (``training.collective_timeout``): a collective that cannot complete (a rank died or went its own way)
ends every rank instead of hanging. Beside it, :class:`ControlPlane` is a gloo group over the same ranks for small
host-side agreements: its collectives move a few bytes between CPUs, never wait for a GPU, and take microseconds
when the ranks are in step (they already are: DDP all-reduces the gradients of every step).
"""

from __future__ import annotations

import logging
import os
import secrets
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from vlbert.training.sharding import release_local_group

logger = logging.getLogger(__name__)

#: The file rank 0 writes into the output directory for the other ranks to read back (removed after the check).
SHARED_TOKEN = ".vlbert-shared-check"


class ProcessGroupError(RuntimeError):
    """The processes of a run cannot agree or reach each other (a collective timed out, ranks see different output
    directories or checkpoints); raised on every rank, the tools print it as one line."""


def launched_processes() -> int:
    """The number of processes the launcher (torchrun, accelerate, Slurm via torchrun) started: ``WORLD_SIZE``."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def use_cpu_processes() -> bool:
    """Whether the run trains on CPUs: no CUDA, or fewer GPUs on this machine than processes (NCCL cannot put two
    ranks on one GPU; gloo can)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return not torch.cuda.is_available() or torch.cuda.device_count() < local


def start_processes(timeout_s: float) -> None:
    """Start accelerate's process state (``torch.distributed.init_process_group`` under a launcher) with every
    collective bounded by ``timeout_s`` seconds, unless it is started already (a one-rank group that bf16-params
    started for this process alone is ended first: :func:`~vlbert.training.sharding.release_local_group`). A single
    process starts nothing here."""
    from accelerate import PartialState

    if launched_processes() > 1:
        release_local_group()  # a one-rank group this process started alone before (a forked worker's parent's)
        if not (dist.is_available() and dist.is_initialized()):
            PartialState(cpu=use_cpu_processes(), timeout=timedelta(seconds=timeout_s))


class ControlPlane:
    """Host-side agreements between the ranks of a started process group, on a gloo group of its own (CPU tensors:
    no GPU synchronisation). With one process every method answers for it alone.

    Raises (every method): :class:`ProcessGroupError` when the collective does not complete within the process
    group's timeout (a rank died, hangs, or is in another collective).
    """

    def __init__(self, timeout_s: float):
        self.world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.rank = dist.get_rank() if self.world > 1 else 0
        self.timeout_s = timeout_s
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s)) if self.world > 1 else None

    def _failed(self, what: str, error: Exception) -> ProcessGroupError:
        return ProcessGroupError(
            f"rank {self.rank}: the ranks could not {what} within {self.timeout_s:g} s "
            f"({type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}); "
            "another rank stopped or hangs: see its output, then run again (with --resume)"
        )

    def any(self, flag: bool, what: str = "agree") -> bool:
        """True if ``flag`` is set on any rank (one all-reduce of one CPU integer)."""
        if self.world == 1:
            return bool(flag)
        t = torch.tensor([int(bool(flag))], dtype=torch.int32)
        try:
            dist.all_reduce(t, group=self.group)
        except (RuntimeError, dist.DistError) as e:
            raise self._failed(what, e) from e
        return bool(t.item())

    def gather(self, value, what: str = "agree") -> list:
        """Every rank's ``value`` (picklable), in rank order, on every rank."""
        if self.world == 1:
            return [value]
        out: list = [None] * self.world
        try:
            dist.all_gather_object(out, value, group=self.group)
        except (RuntimeError, dist.DistError) as e:
            raise self._failed(what, e) from e
        return out


#: What gloo and NCCL say when a collective cannot complete (a peer died, hangs, or is in another collective).
_COLLECTIVE_FAILURES = (
    "Timed out waiting",
    "Connection closed by peer",
    "Connection reset by peer",
    "NCCL communicator was aborted",
    "Watchdog caught collective operation timeout",
)


def collective_failure(error: BaseException) -> ProcessGroupError | None:
    """``error`` as a :class:`ProcessGroupError` (one line, the fix) where it is a collective of several processes
    that could not complete (torch raises a plain ``RuntimeError`` / ``DistError`` from gloo and NCCL), else None."""
    text = str(error)
    if (
        isinstance(error, ProcessGroupError)
        or launched_processes() == 1
        or not (isinstance(error, dist.DistError) or any(m in text for m in _COLLECTIVE_FAILURES))
    ):
        return None
    rank = os.environ.get("RANK", "?")
    return ProcessGroupError(
        f"rank {rank}: a collective between the processes could not complete "
        f"({text.splitlines()[0][:160] if text else type(error).__name__}): another rank stopped "
        "or hangs (see its output); after fixing it, run again with --resume"
    )


_CONTROL: dict[int, ControlPlane] = {}


def control_plane(timeout_s: float) -> ControlPlane:
    """The :class:`ControlPlane` of the current process group (made once per group: every rank must call this at
    the same point the first time, as :func:`torch.distributed.new_group` requires)."""
    key = id(dist.group.WORLD) if dist.is_available() and dist.is_initialized() else 0
    if key not in _CONTROL:
        _CONTROL[key] = ControlPlane(timeout_s)
    return _CONTROL[key]


def check_shared_output_dir(output_dir: str | os.PathLike, control: ControlPlane) -> None:
    """Refuse, on every rank, a run whose ranks do not all see rank 0's output directory (each node's own local
    disk, as cluster scratch space often is): checkpoints written by rank 0 would be missing on the others, which
    would resume from another step and drift apart. Rank 0 writes a random token into ``output_dir``; every rank
    reads it back; the token file is removed. Directories made here for a refused run are removed.

    Raises:
        ProcessGroupError: a rank does not see the token (the ranks named, and the fix).
    """
    if control.world == 1:
        return
    directory = Path(output_dir)
    made = not directory.exists()
    token = secrets.token_hex(16) if control.rank == 0 else None
    if control.rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / SHARED_TOKEN).write_text(token, encoding="utf-8")
    token = control.gather(token, "agree on the output directory")[0]
    path = directory / SHARED_TOKEN
    seen = path.is_file() and path.read_text(encoding="utf-8") == token
    blind = [rank for rank, ok in enumerate(control.gather(seen, "check the output directory")) if not ok]
    if control.rank == 0:
        path.unlink(missing_ok=True)
    if blind:
        if made and directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
        raise ProcessGroupError(
            f"rank(s) {blind} do not see the output directory {directory} that rank 0 writes: the output directory "
            "must be on storage that every node sees (a shared file system), so that every rank writes and resumes "
            "the same checkpoints; pass an --output-dir on shared storage"
        )


def agree_on_checkpoint(step: int | None, control: ControlPlane) -> None:
    """Refuse, on every rank, a resume where the ranks found different newest checkpoints (``step``: this rank's,
    None for none).

    Raises:
        ProcessGroupError: the ranks' steps differ (each rank's named).
    """
    steps = control.gather(step, "agree on the checkpoint to resume")
    if len(set(steps)) > 1:
        found = ", ".join(f"rank {r}: {'none' if s is None else f'step {s}'}" for r, s in enumerate(steps))
        raise ProcessGroupError(
            f"--resume: the ranks found different checkpoints ({found}); the output directory "
            "must be on storage that every node sees, with the same files on every node"
        )


def agree_loaded(error: BaseException | None, control: ControlPlane) -> None:
    """After each rank tried to load the agreed checkpoint: re-raise this rank's ``error``, or stop this rank too
    when another rank could not load it (one line naming that rank), so no rank trains alone.

    Raises:
        the rank's own error; ProcessGroupError: another rank failed.
    """
    failed = [r for r, bad in enumerate(control.gather(error is not None, "load the checkpoint")) if bad]
    if error is not None:
        raise error
    if failed:
        raise ProcessGroupError(
            f"--resume: rank(s) {failed} could not load the checkpoint (see their error); every rank stops"
        )


__all__ = [
    "ProcessGroupError",
    "ControlPlane",
    "control_plane",
    "collective_failure",
    "start_processes",
    "use_cpu_processes",
    "launched_processes",
    "check_shared_output_dir",
    "agree_on_checkpoint",
    "agree_loaded",
    "SHARED_TOKEN",
]
