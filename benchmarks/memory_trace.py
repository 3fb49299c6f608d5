"""The memory of one training step on a GPU that is not there: the step runs on fake CUDA tensors (torch's
``FakeTensorMode``: shapes, dtypes and devices, no arithmetic) under torch's memory tracker
(``torch.distributed._tools.mem_tracker.MemTracker``), which follows every device storage the step allocates and
frees, rounding each up to the caching allocator's 512-byte blocks, and keeps the peak.

Three things stand in for a CUDA driver (:func:`fake_gpu`): ``torch.cuda`` answers as one H100 (so the model takes
its GPU path, flash attention included), the CUDA random state is a host byte tensor (gradient checkpointing saves
and restores it), and the backward is walked here (:func:`backward`), because autograd's C++ engine asks the driver
for the device's context before it runs. The walk frees memory where the engine does: each node's saved tensors are
released once the node has run (``Node::release_variables`` after ``call_function``, torch
``csrc/autograd/engine.cpp``), a gradient once its consumer has taken it; a non-reentrant gradient checkpoint
recomputes its region once per backward (one graph task id for the whole walk). Fresh per trace: nothing of an
earlier step is alive.

Source: torch 2.14 ``torch/distributed/_tools/mem_tracker.py``, ``torch/utils/checkpoint.py`` (``_checkpoint_hook``:
recomputation keyed by ``torch._C._current_graph_task_id()``), ``torch/csrc/autograd/engine.cpp``
(``evaluate_function``, ``validate_outputs``); the fake device follows tests/helpers/fake_cuda.py, without its
recording (benchmarks import no test code).
"""

from __future__ import annotations

import collections
import contextlib
import heapq
from dataclasses import dataclass
from typing import Callable, Iterator
from unittest import mock

import torch
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensorMode

#: the caching allocator's block: every device allocation is a multiple (MemTracker's ``_PYTORCH_MIN_ALLOCATE``)
BLOCK = 512


class _DriverlessFakeMode(FakeTensorMode):
    """FakeTensorMode that never touches a real device, even with ``torch.cuda.is_available()`` patched to True."""

    @property
    def avoid_device_init(self) -> bool:
        return True


class _Properties:
    name, major, minor, total_memory, multi_processor_count = "NVIDIA H100 80GB HBM3", 9, 0, 80 * 2**30, 132


@contextlib.contextmanager
def fake_gpu() -> Iterator[None]:
    """A process with one fake CUDA GPU (an H100, compute capability 9.0) for the duration: tensors put on
    ``cuda`` are FakeTensors, ``Tensor.backward`` is :func:`backward`. Host tensors made inside become fake too:
    build host inputs before entering."""
    rng = torch.zeros(16, dtype=torch.uint8)
    patches = {
        "torch.cuda.is_available": lambda: True,
        "torch.cuda.device_count": lambda: 1,
        "torch.cuda.current_device": lambda: 0,
        "torch.cuda.set_device": lambda device: None,
        "torch.cuda.get_device_capability": lambda device=None: (_Properties.major, _Properties.minor),
        "torch.cuda.get_device_properties": lambda device=None: _Properties(),
        "torch.cuda.get_device_name": lambda device=None: _Properties.name,
        "torch.cuda.synchronize": lambda device=None: None,
        "torch.cuda.is_current_stream_capturing": lambda: False,
        "torch.cuda.get_rng_state": lambda device="cuda": rng.clone(),
        "torch.cuda.set_rng_state": lambda state, device="cuda": None,
        "torch.Tensor.backward": lambda root, gradient=None, *args, **kwargs: backward(root, gradient),
    }
    if hasattr(fake_tensor, "init_gpu_context"):  # torch 2.11 initialises CUDA for a fake CUDA tensor
        patches["torch._subclasses.fake_tensor.init_gpu_context"] = lambda device: None
    with contextlib.ExitStack() as stack:
        for target, new in patches.items():
            stack.enter_context(mock.patch(target, new))
        stack.enter_context(_DriverlessFakeMode(allow_non_fake_inputs=True))
        yield


class SavedTensors:
    """Every tensor the forward saves for the backward, each in a holder the walk empties once the node that
    saved it has run (``with saved:`` around the forward). Holding them here also breaks the cycle a saved output
    makes through its own node, which the garbage collector cannot see."""

    def __init__(self):
        self.holders: list[list] = []
        self.unpacked: list[list] = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> list:
        self.holders.append([tensor])
        return self.holders[-1]

    def _unpack(self, holder: list) -> torch.Tensor:
        self.unpacked.append(holder)
        return holder[0]

    def release_unpacked(self) -> None:
        """Free what the node that just ran read (the engine's ``release_variables``)."""
        for holder in self.unpacked:
            holder.clear()
        self.unpacked.clear()

    def release_all(self) -> None:
        for holder in self.holders:
            holder.clear()
        self.holders.clear()

    def __enter__(self) -> "SavedTensors":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


#: set by :func:`trace_step` for the walk: the forward's saved tensors, and what becomes of a leaf's gradient.
_walk = {"saved": None, "leaf": None}


def backward(root: torch.Tensor, gradient: torch.Tensor | None = None) -> None:
    """``root.backward(gradient)`` without autograd's engine, in its order (a node runs once every consumer of its
    outputs has run, highest sequence number first) and with its frees (module docstring). A leaf's gradient goes
    to ``_walk["leaf"](leaf, grad)`` when set, else is accumulated into ``leaf.grad``."""
    start = root.grad_fn
    if start is None:
        raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
    saved, on_leaf = _walk["saved"] or SavedTensors(), _walk["leaf"] or _accumulate
    consumers = _consumers(start)
    pending = {start: {0: torch.ones_like(root) if gradient is None else gradient}}
    ready = [(-start._sequence_nr(), 0, start)]
    order = 1
    # one graph task: a checkpointed region recomputes once, and frees each recomputed tensor once read
    with torch.no_grad(), mock.patch("torch._C._current_graph_task_id", lambda: 1):
        while ready:
            node = heapq.heappop(ready)[2]
            grads = pending.pop(node, {})
            leaf = getattr(node, "variable", None)
            if leaf is not None:  # AccumulateGrad
                if grads.get(0) is not None:
                    on_leaf(leaf, grads.pop(0))
                continue
            outs = _node_backward(node, grads)
            del grads
            saved.release_unpacked()
            # strict=False: a Python Function's backward gives one gradient per forward argument, None for those
            # that are not tensors, which next_functions does not list
            for (nxt, slot), g in zip(node.next_functions, outs, strict=False):
                if nxt is not None:
                    _pass_on(pending, nxt, slot, g)
                    consumers[nxt] -= 1
                    if consumers[nxt] == 0:
                        heapq.heappush(ready, (-nxt._sequence_nr(), order, nxt))
                        order += 1
            del outs
    saved.release_all()


def _pass_on(pending: dict, node, slot: int, g: torch.Tensor | None) -> None:
    """Gradient ``g`` into input ``slot`` of ``node``, summed to its shape and cast to its dtype, added to what
    came before (the engine's ``validate_outputs`` and ``InputBuffer::add``)."""
    if g is not None:
        m = node._input_metadata[slot]
        g = (g.sum_to_size(m.shape) if tuple(g.shape) != tuple(m.shape) else g).to(m.dtype)
        into = pending.setdefault(node, {})
        into[slot] = g if into.get(slot) is None else into[slot] + g


def _accumulate(leaf: torch.Tensor, grad: torch.Tensor) -> None:
    leaf.grad = grad if leaf.grad is None else leaf.grad + grad


def _consumers(start) -> collections.Counter:
    """Each autograd node below ``start`` -> how many edges lead into it (the gradients it waits for)."""
    consumers, stack, seen = collections.Counter(), [start], {start}
    while stack:
        for node, _ in stack.pop().next_functions:
            if node is not None:
                consumers[node] += 1
                if node not in seen:
                    seen.add(node)
                    stack.append(node)
    return consumers


def _node_backward(node, grads: dict[int, torch.Tensor]) -> tuple:
    """The gradients ``node`` gives its inputs for its outputs' gradients ``grads`` (zeros where none came)."""
    args = [
        grads[i] if grads.get(i) is not None else torch.zeros(m.shape, dtype=m.dtype, device=m.device)
        for i, m in enumerate(node._input_metadata)
    ]
    outs = node.apply(*args) if hasattr(node, "_forward_cls") else node(*args)
    return outs if isinstance(outs, tuple) else (outs,)


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

    with fake_gpu():
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
        saved = SavedTensors()
        _walk.update(saved=saved, leaf=lambda p, g: _to_master(master_of[p], g, tracker))
        try:
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
        finally:
            _walk.update(saved=None, leaf=None)
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


__all__ = ["BLOCK", "fake_gpu", "SavedTensors", "backward", "StepMemory", "blocks", "trace_step"]
