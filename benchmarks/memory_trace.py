"""The memory of one training step on a GPU that is not there: the step runs on fake CUDA tensors (torch's
``FakeTensorMode``: shapes, dtypes and devices, no arithmetic) under torch's memory tracker
(``torch.distributed._tools.mem_tracker.MemTracker``), which follows every device storage the step allocates and
frees, rounding each up to the caching allocator's 512-byte blocks, and keeps the peak.

The step runs on the driverless device of :mod:`benchmarks.fake_device` (``torch.cuda`` answers as one H100, so
the model takes its GPU path, flash attention included; the CUDA random state, which gradient checkpointing saves
and restores, is a host byte tensor), whose backward walk (:class:`~benchmarks.fake_device.GraphWalk`) frees memory
where autograd's engine does: each node's saved tensors are released once the node has run (the forward runs under
:class:`~benchmarks.fake_device.SavedTensors`), a gradient once its consumer has taken it; a non-reentrant gradient
checkpoint recomputes its region once per backward. Fresh per trace: nothing of an earlier step is alive.

Source: torch 2.14 ``torch/distributed/_tools/mem_tracker.py``.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable

import torch

from benchmarks.fake_device import GraphWalk, SavedTensors, fake_gpu

#: the caching allocator's block: every device allocation is a multiple (MemTracker's ``_PYTORCH_MIN_ALLOCATE``)
BLOCK = 512


@dataclass
class StepMemory:
    """One traced step's device memory in bytes (each allocation rounded up to :data:`BLOCK`). ``peak`` and what
    was alive at that moment: ``parameters`` (bf16 compute copy + float32 masters), ``gradients`` (the float32
    gradients made so far: none when the peak is at the start of the backward), ``optimizer`` (AdamW's two float32
    moments + a step counter per tensor), ``activations`` (the rest: saved tensors, the batch, gradients of
    activations, temporaries); they sum to ``peak``. ``static``: parameters + every float32 gradient + optimizer
    state, the part the batch does not change (and FSDP2 shards); ``num_parameters``; ``batch_size``."""

    batch_size: int
    num_parameters: int
    parameters: int
    gradients: int
    optimizer: int
    activations: int
    peak: int
    static: int


def blocks(t: torch.Tensor) -> int:
    """The bytes ``t``'s storage takes on the device: its size rounded up to :data:`BLOCK`."""
    return -(-t.untyped_storage().nbytes() // BLOCK) * BLOCK


def trace_step(build_model: Callable[[], torch.nn.Module], host_batch: dict, batch_size: int) -> StepMemory:
    """The memory of one bf16-params training step, traced on the fake GPU (module docstring): the model
    ``build_model()`` makes with bfloat16 parameters on ``cuda``, float32 masters, fused AdamW over the masters with
    its state already made (a step in steady state), ``host_batch`` (keyword arguments of the model, each a host
    tensor or anything with ``.to(device, non_blocking=...)``; the model's output's ``.loss`` is the loss) copied to the device, forward, backward (each bf16 gradient turned into the
    master's float32 gradient as it arrives), the optimizer step, the masters copied into the parameters."""
    from torch.distributed._tools.mem_tracker import MemTracker

    walk = GraphWalk()
    with fake_gpu(walk):
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device("cuda"):
                model = build_model().train()
        finally:
            torch.set_default_dtype(default)
        params = [p for p in model.parameters() if p.requires_grad]
        masters = [p.detach().float() for p in params]
        master_of = {p: m for p, m in zip(params, masters, strict=True)}
        optimizer = torch.optim.AdamW(masters, lr=1e-4, fused=True)
        for m in masters:  # the moments exist from the first step on
            m.grad = torch.zeros_like(m)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tracker = MemTracker()
        tracker.track_external(model, optimizer, masters)
        walk.saved = saved = SavedTensors()
        walk.on_leaf = lambda p, g: _to_master(master_of[p], g, tracker)
        with tracker:
            batch = {k: v.to("cuda", non_blocking=True) for k, v in host_batch.items()}
            with saved:
                loss = model(**batch).loss
            del batch
            loss.backward()
            del loss
            gradients = sum(blocks(m.grad) for m in masters if m.grad is not None)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                torch._foreach_copy_(params, masters)
        at_peak = _device_parts(tracker.get_tracker_snapshot("peak"))
    parameters = sum(blocks(p) for p in params) + sum(blocks(m) for m in masters)
    optimizer_bytes = sum(blocks(v) for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))
    peak, grads_at_peak = at_peak["Total"], at_peak.get("Gradient", 0)
    activations = peak - parameters - optimizer_bytes - grads_at_peak
    static = parameters + gradients + optimizer_bytes
    n = sum(p.numel() for p in params)
    return StepMemory(batch_size, n, parameters, grads_at_peak, optimizer_bytes, activations, peak, static)


def _to_master(master: torch.Tensor, grad: torch.Tensor, tracker) -> None:
    """A bf16 gradient into its master's float32 gradient, as FSDP2's float32 reduction does per layer; the tracker
    files it as a gradient (its masters are not a module's parameters, whose gradients it would find itself)."""
    from torch.distributed._tools.mem_tracker import _MemRefType

    master.grad = grad.float() if master.grad is None else master.grad + grad
    tracker._update_and_maybe_create_winfos(master.grad, _MemRefType.GRAD)


def _device_parts(snapshot: dict) -> collections.Counter:
    """A tracker snapshot's CUDA part: 'Total', 'Gradient', ... -> bytes."""
    parts = collections.Counter()
    for device, kinds in snapshot.items():
        if torch.device(device).type == "cuda":
            parts.update({getattr(kind, "value", kind): value for kind, value in kinds.items()})
    return parts


__all__ = ["BLOCK", "StepMemory", "blocks", "trace_step"]
