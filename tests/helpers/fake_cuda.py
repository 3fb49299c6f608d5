"""A CUDA device without a GPU, for checking the GPU path of the real trainer on a CPU machine.

Inside :class:`FakeCuda` the process believes it has one CUDA GPU (``torch.cuda.is_available()``, the device's name
and compute capability, accelerate's device), every tensor put on ``cuda`` is a
:class:`~torch._subclasses.fake_tensor.FakeTensor` (shapes, dtypes, strides and devices, no arithmetic), and CPU
work stays real: data loading, tokenisation and collation run as usual, so a training run can go from its config
to its optimizer steps unchanged. What the step does on the device is recorded: every ATen op that reaches the fake
GPU, every host synchronisation (``.item()``, ``nonzero``, ``torch.cuda.synchronize``, and a host-to-device copy
with ``non_blocking=False``, which waits for every kernel queued before it: ``.to(device)``, ``.cuda()``,
``torch.tensor(..., device=...)``, ``copy_`` from the host) and every device-to-host copy, each with the line of
project code that made it; every host-to-device copy's bytes are counted (:attr:`FakeCuda.host_to_device`).

The technique is ../shared/gpu/roofline.py's (FakeTensorMode on a CUDA device, a dispatch mode that records); this
module is the tests' own, smaller version. Two things a driver-less process cannot do are replaced:

* ``Tensor.backward``: autograd's C++ engine asks the CUDA driver for the device's primary context
  (``hasPrimaryContext``) before it runs, so :func:`fake_backward` walks the graph itself, in the engine's order
  (a node runs once every consumer of its outputs has run, highest sequence number first), with the engine's
  shape and dtype checks (``validate_outputs``: sum to the input's shape, cast to its dtype) and gradient
  accumulation into leaves.
* the CUDA random generator and ``torch.cuda.synchronize``, which need a driver: the generator's state is a
  host-side byte tensor here; a synchronize is recorded as a host sync.

Two more calls need a driver on torch 2.11 (the lowest torch pyproject.toml allows), because they follow
``torch.cuda.is_available()``, which is patched to True here, where torch 2.13 and 2.14 ask ``torch.accelerator``,
which is not: a FakeTensor on a CUDA device initialised CUDA (``init_gpu_context``: ``torch.empty(1,
device="cuda")``, for the sake of autograd's engine, which :func:`fake_backward` replaces), and every optimizer step
asks ``torch.cuda.is_current_stream_capturing()``: "Found no NVIDIA driver" on a CPU machine. The first is switched
off, the second answers False.

Source: torch 2.14 ``torch/_subclasses/fake_tensor.py``, ``torch/csrc/autograd/engine.cpp`` (evaluate_function,
validate_outputs); torch 2.11 ``fake_tensor.py`` (``init_gpu_context``, called from ``FakeTensor.__new__``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import traceback
from pathlib import Path
from unittest import mock

import torch
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensor, FakeTensorMode
from torch.autograd.variable import Variable
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten
ROOT = Path(__file__).resolve().parents[2]
HOST_SYNCS = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.is_nonzero.default,
    aten.masked_select.default,
    aten.unique_consecutive.default,
    aten._unique2.default,
}
FLASH = "aten._flash_attention_forward"


def project_line() -> str:
    """'path:line function' of the innermost frame of project code (vlbert/, detectors/, tools/) on the stack."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename)
        if any(part in path.parts for part in ("vlbert", "detectors", "tools")) and "site-packages" not in path.parts:
            return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{frame.lineno} {frame.name}"
    return "?"


def _on_fake_cuda(t) -> bool:
    return isinstance(t, FakeTensor) and t.device.type == "cuda"


class _Recorder(TorchDispatchMode):
    """CPU ops on real tensors run for real; anything touching the fake GPU goes on to the FakeTensorMode below,
    recorded (see :class:`FakeCuda`)."""

    def __init__(self, owner: "FakeCuda"):
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        device = kwargs.get("device")
        to_cuda = device is not None and torch.device(device).type == "cuda"
        if func is aten._pin_memory.default:  # page-locked host memory needs a driver; the bytes are the same
            return args[0]
        if not to_cuda and not any(isinstance(t, FakeTensor) for t in tensors):
            with _disable_current_modes():  # host work: real
                return func(*args, **kwargs)
        owner, name = self.owner, str(func.overloadpacket)
        owner.ops[name] += 1
        copied = _host_to_device(func, args, kwargs)
        if copied is not None:
            source, blocking = copied
            owner.host_to_device.append(
                Copy(
                    source.numel() * source.element_size(),
                    blocking,
                    project_line(),
                    owner.stream,
                    tuple(source.shape),
                    source.dtype,
                )
            )
            if blocking:  # the copy is queued after every kernel before it, and the host waits for it
                owner.host_syncs.append(f"{name} (blocking host-to-device copy) at {project_line()}")
        if func in HOST_SYNCS and any(isinstance(t, FakeTensor) for t in tensors):
            # a value read back from the fake GPU (a fake tensor on the host) is read with a stand-in too; the wait
            # was its device-to-host copy's, recorded there
            if any(_on_fake_cuda(t) for t in tensors):
                owner.host_syncs.append(f"{name} at {project_line()}")
            if func is aten._local_scalar_dense.default:  # the run goes on with a stand-in value
                return False if tensors[0].dtype == torch.bool else 0
            if func is aten.nonzero.default:  # likewise: as if every element were non-zero
                t = tensors[0]
                return torch.empty((t.numel(), t.dim()), dtype=torch.int64, device=t.device)
        try:
            out = func(*args, **kwargs)
        except DynamicOutputShapeException:  # boolean indexing and the like: the host must read the mask
            owner.host_syncs.append(f"{name} (data-dependent shape) at {project_line()}")
            out = _stand_in(func, args)
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if any(_on_fake_cuda(t) for t in tensors) and any(t.device.type == "cpu" for t in outs):
            owner.device_to_host.append(f"{name} at {project_line()}")
        return out


def _host_to_device(func, args, kwargs) -> tuple[torch.Tensor, bool] | None:
    """(the host tensor, whether the copy blocks) for a copy of a real host tensor to the fake GPU, else None:
    ``_to_copy`` to a CUDA device (``.to``, ``.cuda()``, ``torch.tensor``/``as_tensor`` with a CUDA device) or
    ``copy_`` into a GPU tensor. ``non_blocking=False`` (the default) blocks: torch's copy waits for the stream
    (``cudaStreamSynchronize`` after the ``cudaMemcpyAsync``), whether the host memory is pinned or pageable
    (torch 2.14 ``aten/src/ATen/native/cuda/Copy.cu``, ``copy_kernel_cuda``)."""
    if func is aten._to_copy.default:
        device = kwargs.get("device")
        source = args[0]
        if device is not None and torch.device(device).type == "cuda" and not isinstance(source, FakeTensor):
            return source, not kwargs.get("non_blocking", False)
    elif (
        func is aten.copy_.default
        and len(args) >= 2
        and _on_fake_cuda(args[0])
        and isinstance(args[1], torch.Tensor)
        and not isinstance(args[1], FakeTensor)
    ):
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        return args[1], not non_blocking
    return None


def _stand_in(func, args):
    """The output of a data-dependent op as if every mask element were True (so that two selections by one mask
    still agree in shape); raises for ops it does not know."""
    if func is aten.index.Tensor and len(args[1]) == 1 and args[1][0].dtype == torch.bool:
        x, mask = args[0], args[1][0]
        return torch.empty((mask.numel(), *x.shape[mask.dim() :]), dtype=x.dtype, device=x.device)
    raise NotImplementedError(f"no stand-in for the data-dependent {func}")


#: what :func:`fake_backward` runs besides the nodes, as autograd's engine does (filled inside :class:`FakeCuda`):
#: each non-leaf tensor's hooks (``Tensor.register_hook``) by (its node, its output number), each leaf's by the
#: leaf, and the callbacks queued during a backward (``Variable._execution_engine.queue_callback``)
_ENGINE: dict = {"hooks": {}, "leaf_hooks": {}, "callbacks": [], "in_backward": False}


def _register_hook(original):
    """``Tensor.register_hook`` that also tells :func:`fake_backward` (FSDP2's pre-backward unshard is one)."""

    def register_hook(tensor, hook):
        handle = original(tensor, hook)
        if tensor.grad_fn is not None:
            _ENGINE["hooks"].setdefault((tensor.grad_fn, tensor.output_nr), []).append(hook)
        else:
            _ENGINE["leaf_hooks"].setdefault(tensor, []).append(hook)
        return handle

    return register_hook


class _Engine:
    """``Variable._execution_engine`` whose ``queue_callback`` queues for :func:`fake_backward` (FSDP2's
    post-backward final callback, which finishes the reduce-scatters); anything else is torch's engine."""

    def __init__(self, engine):
        self.engine = engine

    def queue_callback(self, callback) -> None:
        if not _ENGINE["in_backward"]:
            raise RuntimeError("Final callbacks can only be installed during backward pass.")
        _ENGINE["callbacks"].append(callback)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def _with_hooks(hooks: list, grad):
    for hook in hooks:
        new = hook(grad)
        grad = grad if new is None else new
    return grad


def fake_backward(
    root: torch.Tensor, gradient: torch.Tensor | None = None, retain_graph=None, create_graph=False, inputs=None
) -> None:
    """``root.backward(gradient)`` without autograd's engine (see the module docstring): leaves' ``.grad`` are set
    or accumulated into; tensors' hooks run on their gradients before their node runs (a leaf's before it
    accumulates), and callbacks queued during the backward run after the graph, as the engine runs them (FSDP2
    relies on both); ``torch._C._current_graph_task_id()`` is not -1 meanwhile. ``retain_graph``, ``create_graph``
    and ``inputs`` are not supported (ignored / refused)."""
    if create_graph or inputs is not None:
        raise NotImplementedError("fake_backward computes first-order gradients of every leaf only")
    start = root.grad_fn
    if start is None:
        raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
    consumers = _consumers(start)
    pending = {start: {root.output_nr: torch.ones_like(root) if gradient is None else gradient}}
    ready = [(-start._sequence_nr(), 0, start)]
    order = 1
    _ENGINE["in_backward"] = True
    try:
        with torch.no_grad():
            while ready:
                node = heapq.heappop(ready)[2]
                grads = pending.pop(node, {})
                for slot in list(grads):
                    hooks = _ENGINE["hooks"].pop((node, slot), [])
                    grads[slot] = _with_hooks(hooks, grads[slot]) if grads[slot] is not None else None
                leaf = getattr(node, "variable", None)
                if leaf is not None:  # AccumulateGrad
                    g = grads.get(0)
                    if g is not None:
                        g = _with_hooks(_ENGINE["leaf_hooks"].get(leaf, []), g)
                        leaf.grad = g if leaf.grad is None else leaf.grad + g
                    continue
                for (nxt, slot), g in _node_backward(node, grads):
                    if g is not None:
                        m = nxt._input_metadata[slot]
                        g = (g.sum_to_size(m.shape) if tuple(g.shape) != tuple(m.shape) else g).to(m.dtype)
                        into = pending.setdefault(nxt, {})
                        into[slot] = g if into.get(slot) is None else into[slot] + g
                    consumers[nxt] -= 1
                    if consumers[nxt] == 0:
                        heapq.heappush(ready, (-nxt._sequence_nr(), order, nxt))
                        order += 1
            while _ENGINE["callbacks"]:
                _ENGINE["callbacks"].pop(0)()
    finally:
        _ENGINE["in_backward"] = False
        _ENGINE["callbacks"].clear()


def _consumers(start) -> collections.Counter:
    """Each autograd node below ``start`` -> how many edges of the graph lead into it (the gradients it waits for
    before it runs)."""
    consumers, stack, seen = collections.Counter(), [start], {start}
    while stack:
        for node, _ in stack.pop().next_functions:
            if node is not None:
                consumers[node] += 1
                if node not in seen:
                    seen.add(node)
                    stack.append(node)
    return consumers


def _node_backward(node, grads: dict[int, torch.Tensor]) -> list:
    """(next node, its input slot), gradient for each edge out of the autograd ``node`` that leads to a node, for
    the gradients ``grads`` of its outputs (output index -> gradient; zeros where an output received none). A
    Python Function's backward gives one gradient per forward argument (None for those that are not tensors:
    FSDP2's parameter group before its tensors, _FlashVarlen's maximum lengths after them), while its
    ``next_functions`` lists its tensor arguments only: the arguments that need a gradient
    (``needs_input_grad``) are, in order, those whose edge leads to a node."""
    args = [
        grads[i] if grads.get(i) is not None else torch.zeros(m.shape, dtype=m.dtype, device=m.device)
        for i, m in enumerate(node._input_metadata)
    ]
    python = hasattr(node, "_forward_cls")
    outs = node.apply(*args) if python else node(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    edges = [e for e in node.next_functions if e[0] is not None]
    if python:
        outs = tuple(g for g, needed in zip(outs, node.needs_input_grad, strict=False) if needed)
        return list(zip(edges, outs, strict=False))
    return [(e, g) for e, g in zip(node.next_functions, outs, strict=False) if e[0] is not None]


@dataclasses.dataclass
class Copy:
    """One host-to-device copy: its bytes, whether the host waits for it, the project line that made it, the
    stream it was issued on ("compute", or the name of a :class:`_Stream` made by the code), and the host tensor's
    shape and dtype."""

    bytes: int
    blocking: bool
    line: str
    stream: str
    shape: tuple = ()
    dtype: torch.dtype | None = None


class _Event:
    """``torch.cuda.Event`` without a driver: remembers the stream it was recorded on (the current stream when
    none is given, as CUDA's); a host wait on it (``synchronize``) is recorded as a host sync."""

    owner: "FakeCuda | None" = None

    def __init__(self, *args, **kwargs):
        self.stream = None

    def record(self, stream=None):
        self.stream = stream if stream is not None or self.owner is None else _Stream(self.owner, self.owner.stream)

    def wait(self, stream=None) -> None:
        if self.owner is not None:
            waiting = stream.name if stream is not None else self.owner.stream
            self.owner.stream_log.append(("wait", waiting, getattr(self.stream, "name", None)))

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        if self.owner is not None:
            self.owner.host_syncs.append(f"torch.cuda.Event.synchronize at {project_line()}")


class _Stream:
    """``torch.cuda.Stream`` without a driver: a name; what waits on what is written to the owner's
    ``stream_log``."""

    made = 0

    def __init__(self, owner: "FakeCuda", name: str | None = None):
        if name is None:
            _Stream.made += 1
            name = f"side-{_Stream.made}"
        self.owner, self.name = owner, name

    def wait_event(self, event: _Event) -> None:
        self.owner.stream_log.append(("wait", self.name, getattr(event.stream, "name", None)))

    def wait_stream(self, stream: "_Stream") -> None:
        self.owner.stream_log.append(("wait", self.name, stream.name))

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:  # (torch 2.14's optimizers ask the accelerator's current stream)
        return False

    def synchronize(self) -> None:
        self.owner.host_syncs.append(f"torch.cuda.Stream.synchronize at {project_line()}")

    def record_event(self, event: _Event | None = None) -> _Event:
        event = event or _Event()
        event.record(self)
        return event


class _DriverlessFakeMode(FakeTensorMode):
    """FakeTensorMode that never touches a real device, even with ``torch.cuda.is_available()`` patched to True
    (it would otherwise materialise constants on the device and initialise CUDA)."""

    @property
    def avoid_device_init(self) -> bool:
        return True


class _Properties:
    def __init__(self, name: str, capability: tuple[int, int]):
        self.name, (self.major, self.minor) = name, capability
        self.total_memory, self.multi_processor_count = 80 * 2**30, 132


class FakeCuda:
    """A process with one fake CUDA GPU (see the module docstring).

    Args:
        capability: the device's compute capability, (9, 0) an H100; (7, 5) a T4, (7, 0) a V100.
        name: what ``torch.cuda.get_device_name`` answers.
    Attributes (filled while active):
        ops: Counter of ATen op names that reached the fake GPU.
        host_syncs: one 'op at file:line function' per host synchronisation on a GPU tensor (blocking
            host-to-device copies included).
        device_to_host: likewise per copy from the GPU to the host.
        host_to_device: a :class:`Copy` per copy from the host to the GPU.
        stream_log: ("wait", stream, on the stream of the event) per ``wait_event``, ("record", stream, bytes) per
            ``Tensor.record_stream``: CUDA streams (``torch.cuda.Stream``, ``torch.cuda.stream``, ``Event``) are
            names here, the copies issued in a ``torch.cuda.stream(s)`` block carry ``s``'s.

    Use ``with FakeCuda() as gpu:``; :meth:`clear` forgets what was recorded so far.
    """

    def __init__(self, capability: tuple[int, int] = (9, 0), name: str = "NVIDIA H100 80GB HBM3"):
        self.capability, self.name = capability, name
        self.ops: collections.Counter = collections.Counter()
        self.host_syncs: list[str] = []
        self.device_to_host: list[str] = []
        self.host_to_device: list[Copy] = []
        self.stream_log: list[tuple] = []
        self.stream = "compute"  # the current stream's name
        self._stack = contextlib.ExitStack()

    def clear(self) -> None:
        self.ops.clear()
        self.host_syncs.clear()
        self.device_to_host.clear()
        self.host_to_device.clear()
        self.stream_log.clear()

    @contextlib.contextmanager
    def _use_stream(self, stream):
        previous, self.stream = self.stream, stream.name if stream is not None else self.stream
        try:
            yield
        finally:
            self.stream = previous

    def _record_stream(self, tensor, stream) -> None:
        self.stream_log.append(("record", stream.name, tensor.numel() * tensor.element_size()))

    def _stream_class(self) -> type:
        """``torch.cuda.Stream`` here: a class, not a function, as a module first imported inside the fake GPU may
        write ``torch.cuda.Stream | None`` in a signature (transformers 5.17's continuous batching does)."""
        owner = self

        class Stream(_Stream):
            def __init__(self, device=None, priority=0):
                super().__init__(owner)

        return Stream

    def _synchronize(self, device=None) -> None:
        self.host_syncs.append(f"torch.cuda.synchronize at {project_line()}")

    def __enter__(self) -> "FakeCuda":
        props = _Properties(self.name, self.capability)
        rng = torch.zeros(16, dtype=torch.uint8)
        patches = {
            "torch.cuda.is_available": lambda: True,
            "torch.cuda.device_count": lambda: 1,
            "torch.cuda.current_device": lambda: 0,
            "torch.cuda.set_device": lambda device: None,
            "torch.cuda.get_device_capability": lambda device=None: self.capability,
            "torch.cuda.get_device_properties": lambda device=None: props,
            "torch.cuda.get_device_name": lambda device=None: self.name,
            "torch.cuda.synchronize": self._synchronize,
            # torch 2.11's optimizers ask before each step (module docstring)
            "torch.cuda.is_current_stream_capturing": lambda: False,
            "torch.cuda.get_rng_state": lambda device="cuda": rng.clone(),
            "torch.cuda.get_rng_state_all": lambda: [rng.clone()],
            "torch.cuda.set_rng_state": lambda state, device="cuda": None,
            "torch.cuda.set_rng_state_all": lambda states: None,
            "torch.cuda.manual_seed": lambda seed: None,
            "torch.cuda.manual_seed_all": lambda seed: None,
            "torch.Tensor.backward": fake_backward,
            "torch.cuda.Stream": self._stream_class(),
            "torch.cuda.stream": self._use_stream,
            "torch.cuda.Event": type("Event", (_Event,), {"owner": self}),
            "torch.cuda.current_stream": lambda device=None: _Stream(self, self.stream),
            # FSDP2 waits on a prefetched all-gather no forward used through the accelerator's stream
            "torch.accelerator.current_stream": lambda device=None: _Stream(self, self.stream),
            "torch.Tensor.record_stream": lambda tensor, stream: self._record_stream(tensor, stream),
            # what FSDP2 (bf16-params) asks of autograd's engine, which fake_backward stands in for
            "torch.Tensor.register_hook": _register_hook(torch.Tensor.register_hook),
            "torch.autograd.variable.Variable._execution_engine": _Engine(Variable._execution_engine),
            "torch._C._current_graph_task_id": lambda: 0 if _ENGINE["in_backward"] else -1,
            # NCCL needs a driver: a one-rank process group takes gloo for the fake GPU's tensors
            "torch.distributed.is_nccl_available": lambda: False,
        }
        if hasattr(fake_tensor, "init_gpu_context"):  # torch 2.11 would initialise CUDA (module docstring)
            patches["torch._subclasses.fake_tensor.init_gpu_context"] = lambda device: None
        for target, new in patches.items():
            self._stack.enter_context(mock.patch(target, new))
        fake = _DriverlessFakeMode(allow_non_fake_inputs=True)
        # Module.to swaps a fake parameter with its cast (torch.utils.swap_tensors), which refuses tensors that
        # something holds weak references to, as the converter's memos do to every tensor it converted and made:
        # strong references instead (kept while the mode lives)
        meta = fake.fake_tensor_converter.meta_converter
        meta.describer.lookup_tensor, meta.tensor_memo = {}, {}
        self._stack.enter_context(fake)
        self._stack.enter_context(_Recorder(self))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
        for registry in ("hooks", "leaf_hooks"):
            _ENGINE[registry].clear()


def placement_errors(trainer) -> list[str]:
    """Every parameter, gradient, float32 master (with its gradient) and optimizer state of ``trainer`` that is not
    on the trainer's device, one line each."""
    device = trainer.accelerator.device
    errors = []

    def check(what: str, t) -> None:
        if torch.is_tensor(t) and t.device.type != device.type:
            errors.append(f"{what} on {t.device}")

    for name, p in trainer.unwrapped.named_parameters():
        check(f"parameter {name}", p)
        check(f"gradient of {name}", p.grad)
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    for i, group in enumerate(optimizer.param_groups):
        for j, p in enumerate(group["params"]):
            check(f"optimizer parameter {i}.{j}", p)
            check(f"optimizer gradient {i}.{j}", p.grad)
            for key, value in optimizer.state.get(p, {}).items():
                check(f"optimizer state {key} of {i}.{j}", value)
    return errors


__all__ = ["FakeCuda", "Copy", "fake_backward", "placement_errors", "FLASH"]
