"""Rank 0 of a world of several processes, in this one process: torch's fake process group.

Inside :func:`fake_processes` the default process group is torch's ``fake`` backend
(``torch.testing._internal.distributed.fake_pg``: a ``FakeStore`` and ``init_process_group("fake", rank=0,
world_size=N)``): every collective is dispatched as on a real group (the c10d ops, their ``Work``) but exchanges
nothing, so under :class:`fake_cuda.FakeCuda` a whole training step of rank 0 runs on fake tensors, with what a
launched run adds at N processes (FSDP2's all-gathers and reduce-scatters over N ranks, the distributed sampler's
share, the global-batch gathers of ITC and ITM's negatives, the losses weighted across ranks), and the recorder sees
every host wait it makes. torchtitan and torch's FSDP memory tests trace distributed steps this way.

What ``accelerate launch`` gives each process is set: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
``LOCAL_WORLD_SIZE`` (one process per machine, each with its one GPU: the fake GPU is ``cuda:0``), ``MASTER_ADDR``
and ``MASTER_PORT`` (never connected to: the group is started here); accelerate's process state is started afresh.
The host-side agreements of :class:`~vlbert.training.processes.ControlPlane` (a gloo group of its own, on CPU
objects) answer as if every other rank agreed with rank 0 (the fake group would hand back no one's objects): a
pickled object cannot be faked. Everything is put back on exit (the group destroyed, the environment and
accelerate's state as they were before, a one-rank group of an earlier bf16-params run ended first and started
again by the next run that needs it).

Source: torch 2.14 ``torch/testing/_internal/distributed/fake_pg.py``; accelerate 1.x ``state.py``
(``PartialState``: the launcher's environment, a process group already started is kept).
"""

from __future__ import annotations

import contextlib
import os
from unittest import mock

import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
from accelerate.state import AcceleratorState
from torch.testing._internal.distributed.fake_pg import FakeStore

from vlbert.training import processes
from vlbert.training.sharding import release_local_group

LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _new_group(original):
    """``dist.new_group`` on the fake backend whatever backend is asked (a gloo group would wait for the other
    ranks to connect)."""

    def new_group(*args, **kwargs):
        kwargs["backend"] = "fake"
        return original(*args, **kwargs)

    return new_group


@contextlib.contextmanager
def fake_processes(world_size: int = 2):
    """This process as rank 0 of ``world_size`` processes on torch's fake process group (module docstring);
    yields the group. Use inside :class:`fake_cuda.FakeCuda` for a GPU run.

    Raises:
        RuntimeError: a process group other than bf16-params' own one-rank group is already started."""
    release_local_group()
    if dist.is_initialized():
        raise RuntimeError("fake_processes: a process group is already started in this process")
    env = {
        "RANK": "0",
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, env))
        stack.enter_context(mock.patch.dict(processes._CONTROL, clear=True))
        stack.enter_context(mock.patch("torch.distributed.new_group", _new_group(dist.new_group)))
        stack.enter_context(
            mock.patch.object(processes.ControlPlane, "gather", lambda self, value, what="": [value] * self.world)
        )
        stack.enter_context(mock.patch.object(processes.ControlPlane, "any", lambda self, flag, what="": bool(flag)))
        AcceleratorState._reset_state(reset_partial_state=True)
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
        try:
            yield dist.group.WORLD
        finally:
            dist.destroy_process_group()
            AcceleratorState._reset_state(reset_partial_state=True)


__all__ = ["fake_processes", "LAUNCHER_ENV"]
