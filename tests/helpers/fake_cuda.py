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

The device itself is benchmarks/fake_device.py's (:func:`~benchmarks.fake_device.fake_gpu`, shared with ``vlbert
benchmark memory``): FakeTensorMode on a CUDA device that needs no driver, the CUDA random generator as a host
tensor, and ``Tensor.backward`` as a walk of autograd's graph in the engine's order
(:class:`~benchmarks.fake_device.GraphWalk`), which here also runs tensors' hooks and the callbacks queued during the
backward, as the engine does (FSDP2 relies on both). This module adds the recording (the technique of
../shared/gpu/roofline.py: a dispatch mode above the FakeTensorMode), streams and events without a driver (names;
what waits on what is logged), and ``torch.cuda.synchronize`` recorded as a host sync.

Source: torch 2.14 ``torch/_subclasses/fake_tensor.py``, ``torch/utils/_python_dispatch.py`` (``TorchDispatchMode``),
``aten/src/ATen/native/cuda/Copy.cu`` (``copy_kernel_cuda``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import traceback
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

from benchmarks.fake_device import DeviceProperties, GraphWalk, fake_gpu

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
        self.walk = GraphWalk()
        patches = {
            "torch.cuda.synchronize": self._synchronize,
            "torch.cuda.Stream": self._stream_class(),
            "torch.cuda.stream": self._use_stream,
            "torch.cuda.Event": type("Event", (_Event,), {"owner": self}),
            "torch.cuda.current_stream": lambda device=None: _Stream(self, self.stream),
            # FSDP2 waits on a prefetched all-gather no forward used through the accelerator's stream
            "torch.accelerator.current_stream": lambda device=None: _Stream(self, self.stream),
            "torch.Tensor.record_stream": lambda tensor, stream: self._record_stream(tensor, stream),
            # what FSDP2 (bf16-params) asks of autograd's engine, which the graph walk stands in for
            **self.walk.engine_patches(),
            # NCCL needs a driver: a one-rank process group takes gloo for the fake GPU's tensors
            "torch.distributed.is_nccl_available": lambda: False,
        }
        properties = DeviceProperties(self.name, *self.capability)
        fake = self._stack.enter_context(fake_gpu(self.walk, properties, patches))
        # Module.to swaps a fake parameter with its cast (torch.utils.swap_tensors), which refuses tensors that
        # something holds weak references to, as the converter's memos do to every tensor it converted and made:
        # strong references instead (kept while the mode lives)
        meta = fake.fake_tensor_converter.meta_converter
        meta.describer.lookup_tensor, meta.tensor_memo = {}, {}
        self._stack.enter_context(_Recorder(self))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
        self.walk.hooks.clear()
        self.walk.leaf_hooks.clear()


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


__all__ = ["FakeCuda", "Copy", "placement_errors", "FLASH"]
