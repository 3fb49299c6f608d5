"""A CUDA device without a driver: one fake GPU for code that takes its CUDA path on a machine that has none, and
autograd's backward walked in Python, because autograd's C++ engine needs the driver.

Inside :func:`fake_gpu` the process believes it has one CUDA GPU (``torch.cuda.is_available()``, the device's name,
compute capability and properties), every tensor put on ``cuda`` is a
:class:`~torch._subclasses.fake_tensor.FakeTensor` (shapes, dtypes, strides and devices, no arithmetic), and what
needs a driver is replaced:

* ``Tensor.backward``: autograd's engine asks the driver for the device's primary context (``hasPrimaryContext``)
  before it runs, so :class:`GraphWalk` walks the graph itself, in the engine's order (a node runs once every
  consumer of its outputs has run, highest sequence number first), with the engine's shape and dtype checks
  (``validate_outputs``: sum to the input's shape, cast to its dtype) and gradient accumulation into leaves. It runs
  tensors' hooks and the callbacks queued during the backward, as the engine does (:meth:`GraphWalk.engine_patches`),
  and, given :class:`SavedTensors`, frees the forward's saved tensors where the engine does
  (``Node::release_variables`` after ``call_function``). ``torch._C._current_graph_task_id()`` is one id for the
  whole walk, so a non-reentrant gradient checkpoint recomputes its region once per backward.
* the CUDA random generator (its state is a host-side byte tensor here; seeding does nothing) and
  ``torch.cuda.synchronize`` (nothing to wait for).

Two more calls need a driver on torch 2.11 (the lowest torch pyproject.toml allows), because they follow
``torch.cuda.is_available()``, which is patched to True here, where torch 2.13 and 2.14 ask ``torch.accelerator``,
which is not: a FakeTensor on a CUDA device initialised CUDA (``init_gpu_context``: ``torch.empty(1,
device="cuda")``, for the sake of autograd's engine, which :class:`GraphWalk` replaces), and every optimizer step
asks ``torch.cuda.is_current_stream_capturing()``: "Found no NVIDIA driver" on a CPU machine. The first is switched
off, the second answers False.

``vlbert benchmark memory`` (benchmarks/memory_trace.py) traces a training step's memory on this device; the tests'
``FakeCuda`` (tests/helpers/fake_cuda.py) records what a training step does on it.

Source: torch 2.14 ``torch/_subclasses/fake_tensor.py``, ``torch/csrc/autograd/engine.cpp`` (``evaluate_function``,
``validate_outputs``, ``InputBuffer::add``), ``torch/utils/checkpoint.py`` (``_checkpoint_hook``: recomputation
keyed by ``torch._C._current_graph_task_id()``); torch 2.11 ``fake_tensor.py`` (``init_gpu_context``, called from
``FakeTensor.__new__``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
from typing import Callable, Iterator
from unittest import mock

import torch
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.autograd.variable import Variable


class DriverlessFakeMode(FakeTensorMode):
    """FakeTensorMode that never touches a real device, even with ``torch.cuda.is_available()`` patched to True
    (it would otherwise materialise constants on the device and initialise CUDA).

    Source: torch 2.14 ``torch/_subclasses/fake_tensor.py`` (``FakeTensorMode.avoid_device_init``)."""

    @property
    def avoid_device_init(self) -> bool:
        return True


@dataclasses.dataclass
class DeviceProperties:
    """What ``torch.cuda.get_device_properties`` answers on the fake GPU: ``name``; ``major``, ``minor``: the compute
    capability; ``total_memory`` in bytes; ``multi_processor_count``. The defaults are an H100 SXM's.

    Source: torch 2.14 ``torch.cuda.get_device_properties`` (``_CudaDeviceProperties``: the fields code reads)."""

    name: str = "NVIDIA H100 80GB HBM3"
    major: int = 9
    minor: int = 0
    total_memory: int = 80 * 2**30
    multi_processor_count: int = 132


class SavedTensors:
    """Every tensor the forward saves for the backward, each in a holder that :class:`GraphWalk` empties once the
    node that saved it has run (``with saved:`` around the forward). Holding them here also breaks the cycle a saved
    output makes through its own node, which the garbage collector cannot see.

    Source: torch 2.14 ``torch.autograd.graph.saved_tensors_hooks``; ``torch/csrc/autograd/engine.cpp``
    (``release_variables`` after a node's ``call_function``)."""

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
        """Free every saved tensor (the graph is done with)."""
        for holder in self.holders:
            holder.clear()
        self.holders.clear()

    def __enter__(self) -> "SavedTensors":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def _accumulate(leaf: torch.Tensor, grad: torch.Tensor) -> None:
    leaf.grad = grad if leaf.grad is None else leaf.grad + grad


def _with_hooks(hooks: list, grad: torch.Tensor) -> torch.Tensor:
    for hook in hooks:
        new = hook(grad)
        grad = grad if new is None else new
    return grad


class _Engine:
    """``Variable._execution_engine`` whose ``queue_callback`` queues for a :class:`GraphWalk` (FSDP2's
    post-backward final callback, which finishes the reduce-scatters); anything else is torch's engine."""

    def __init__(self, engine, walk: "GraphWalk"):
        self.engine, self.walk = engine, walk

    def queue_callback(self, callback) -> None:
        if not self.walk.running:
            raise RuntimeError("Final callbacks can only be installed during backward pass.")
        self.walk.callbacks.append(callback)

    def __getattr__(self, name):
        return getattr(self.engine, name)


class GraphWalk:
    """``root.backward(gradient)`` without autograd's engine (module docstring), for ``Tensor.backward`` inside
    :func:`fake_gpu`: called as ``walk(root, gradient)``, it sets or accumulates into each leaf's ``.grad``.

    Args:
        saved: the forward's :class:`SavedTensors`: each node's saved tensors are freed once it has run, all of
            them after the walk; None: nothing is freed by the walk.
        on_leaf: ``on_leaf(leaf, grad)`` takes each leaf's gradient instead of accumulating it into ``leaf.grad``.
    Attributes:
        hooks: (autograd node, output number) -> the hooks of the non-leaf tensor it made, run on its gradient
            before the node runs; leaf_hooks: leaf -> its hooks, run before it accumulates. Filled by
            ``Tensor.register_hook`` under :meth:`engine_patches`.
        callbacks: what ``Variable._execution_engine.queue_callback`` queued during the walk, run after the graph.
        running: True while a walk runs.

    Raises (on call): RuntimeError when ``root`` has no ``grad_fn``; NotImplementedError for ``create_graph`` or
    ``inputs`` (first-order gradients of every leaf only; ``retain_graph`` is ignored).

    Source: torch 2.14 ``torch/csrc/autograd/engine.cpp`` (``evaluate_function``, ``validate_outputs``,
    ``InputBuffer::add``, ``queue_callback``), ``torch/csrc/autograd/python_function.cpp`` (a Python Function's
    edges: its tensor arguments only).
    """

    def __init__(self, saved: SavedTensors | None = None, on_leaf: Callable | None = None):
        self.saved, self.on_leaf = saved, on_leaf or _accumulate
        self.hooks: dict = {}
        self.leaf_hooks: dict = {}
        self.callbacks: list = []
        self.running = False

    def engine_patches(self) -> dict:
        """The patches (target -> replacement, for ``mock.patch``) that route ``Tensor.register_hook`` and
        ``Variable._execution_engine.queue_callback`` to this walk (FSDP2's pre-backward unshard and post-backward
        reduce-scatters use them)."""
        original = torch.Tensor.register_hook

        def register_hook(tensor, hook):
            handle = original(tensor, hook)
            if tensor.grad_fn is not None:
                self.hooks.setdefault((tensor.grad_fn, tensor.output_nr), []).append(hook)
            else:
                self.leaf_hooks.setdefault(tensor, []).append(hook)
            return handle

        return {
            "torch.Tensor.register_hook": register_hook,
            "torch.autograd.variable.Variable._execution_engine": _Engine(Variable._execution_engine, self),
        }

    def __call__(
        self,
        root: torch.Tensor,
        gradient: torch.Tensor | None = None,
        retain_graph=None,
        create_graph=False,
        inputs=None,
    ) -> None:
        if create_graph or inputs is not None:
            raise NotImplementedError("the graph walk computes first-order gradients of every leaf only")
        start = root.grad_fn
        if start is None:
            raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
        pending = {start: {root.output_nr: torch.ones_like(root) if gradient is None else gradient}}
        self.running = True
        try:
            # one graph task: a checkpointed region recomputes once, and frees each recomputed tensor once read
            with torch.no_grad(), mock.patch("torch._C._current_graph_task_id", lambda: 0):
                self._walk(start, pending)
                while self.callbacks:
                    self.callbacks.pop(0)()
        finally:
            self.running = False
            self.callbacks.clear()
        if self.saved is not None:
            self.saved.release_all()

    def _walk(self, start, pending: dict) -> None:
        """Run every node below ``start`` in the engine's order, gradients flowing through ``pending`` (node ->
        input slot -> gradient); a gradient goes once its consumer has taken it."""
        consumers = _consumers(start)
        ready = [(-start._sequence_nr(), 0, start)]
        order = 1
        while ready:
            node = heapq.heappop(ready)[2]
            grads = pending.pop(node, {})
            if self.hooks:
                self._run_hooks(node, grads)
            leaf = getattr(node, "variable", None)
            if leaf is not None:  # AccumulateGrad
                if grads.get(0) is not None:
                    self.on_leaf(leaf, _with_hooks(self.leaf_hooks.get(leaf, []), grads.pop(0)))
                continue
            outs = _node_backward(node, grads)
            del grads
            if self.saved is not None:
                self.saved.release_unpacked()
            for (nxt, slot), g in _edges(node, outs):
                if nxt is not None:
                    _pass_on(pending, nxt, slot, g)
                    consumers[nxt] -= 1
                    if consumers[nxt] == 0:
                        heapq.heappush(ready, (-nxt._sequence_nr(), order, nxt))
                        order += 1
            del outs

    def _run_hooks(self, node, grads: dict) -> None:
        """Each output's gradient through the hooks of the tensor it is the gradient of (each runs once)."""
        for slot in list(grads):
            hooks = self.hooks.pop((node, slot), [])
            grads[slot] = _with_hooks(hooks, grads[slot]) if grads[slot] is not None else None


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


def _node_backward(node, grads: dict[int, torch.Tensor]) -> tuple:
    """What ``node``'s backward returns for its outputs' gradients ``grads`` (output index -> gradient; zeros where
    an output received none), as a tuple."""
    args = [
        grads[i] if grads.get(i) is not None else torch.zeros(m.shape, dtype=m.dtype, device=m.device)
        for i, m in enumerate(node._input_metadata)
    ]
    outs = node.apply(*args) if hasattr(node, "_forward_cls") else node(*args)
    return outs if isinstance(outs, tuple) else (outs,)


def _edges(node, outs: tuple) -> list:
    """((next node or None, its input slot), gradient) per edge out of ``node``, for what its backward returned. A
    Python Function's backward gives one gradient per forward argument (None for those that are not tensors:
    FSDP2's parameter group before its tensors, _FlashVarlen's maximum lengths after them), while its
    ``next_functions`` lists its tensor arguments only: the arguments that need a gradient (``needs_input_grad``)
    are, in order, those whose edge leads to a node."""
    if not hasattr(node, "_forward_cls"):
        return list(zip(node.next_functions, outs, strict=False))
    needed = [g for g, need in zip(outs, node.needs_input_grad, strict=False) if need]
    return list(zip([e for e in node.next_functions if e[0] is not None], needed, strict=False))


def _pass_on(pending: dict, node, slot: int, g: torch.Tensor | None) -> None:
    """Gradient ``g`` into input ``slot`` of ``node``, summed to its shape and cast to its dtype, added to what
    came before (the engine's ``validate_outputs`` and ``InputBuffer::add``)."""
    if g is not None:
        m = node._input_metadata[slot]
        g = (g.sum_to_size(m.shape) if tuple(g.shape) != tuple(m.shape) else g).to(m.dtype)
        into = pending.setdefault(node, {})
        into[slot] = g if into.get(slot) is None else into[slot] + g


@contextlib.contextmanager
def fake_gpu(
    walk: GraphWalk | None = None, properties: DeviceProperties | None = None, patches: dict | None = None
) -> Iterator[DriverlessFakeMode]:
    """A process with one fake CUDA GPU for the duration (module docstring); yields the active
    :class:`DriverlessFakeMode`. Tensors put on ``cuda`` are FakeTensors; host tensors made inside become fake too
    unless another mode above it runs them (build host inputs before entering).

    Args:
        walk: what ``Tensor.backward`` runs (a fresh :class:`GraphWalk` when None).
        properties: the device (an H100 when None).
        patches: more ``mock.patch`` targets -> replacements, applied after (over) this function's own.
    """
    walk = walk or GraphWalk()
    props = properties or DeviceProperties()
    rng = torch.zeros(16, dtype=torch.uint8)

    def backward(root, gradient=None, retain_graph=None, create_graph=False, inputs=None) -> None:
        walk(root, gradient, retain_graph, create_graph, inputs)

    table = {
        "torch.cuda.is_available": lambda: True,
        "torch.cuda.device_count": lambda: 1,
        "torch.cuda.current_device": lambda: 0,
        "torch.cuda.set_device": lambda device: None,
        "torch.cuda.get_device_capability": lambda device=None: (props.major, props.minor),
        "torch.cuda.get_device_properties": lambda device=None: props,
        "torch.cuda.get_device_name": lambda device=None: props.name,
        "torch.cuda.synchronize": lambda device=None: None,
        # torch 2.11's optimizers ask before each step (module docstring)
        "torch.cuda.is_current_stream_capturing": lambda: False,
        "torch.cuda.get_rng_state": lambda device="cuda": rng.clone(),
        "torch.cuda.get_rng_state_all": lambda: [rng.clone()],
        "torch.cuda.set_rng_state": lambda state, device="cuda": None,
        "torch.cuda.set_rng_state_all": lambda states: None,
        "torch.cuda.manual_seed": lambda seed: None,
        "torch.cuda.manual_seed_all": lambda seed: None,
        "torch.Tensor.backward": backward,
    }
    if hasattr(fake_tensor, "init_gpu_context"):  # torch 2.11 would initialise CUDA (module docstring)
        table["torch._subclasses.fake_tensor.init_gpu_context"] = lambda device: None
    table.update(patches or {})
    with contextlib.ExitStack() as stack:
        for target, new in table.items():
            stack.enter_context(mock.patch(target, new))
        mode = DriverlessFakeMode(allow_non_fake_inputs=True)
        stack.enter_context(mode)
        yield mode


__all__ = ["DriverlessFakeMode", "DeviceProperties", "SavedTensors", "GraphWalk", "fake_gpu"]
