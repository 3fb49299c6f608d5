"""bf16 parameters trained through float32 master weights (``training.mixed_precision: bf16-params``).

Source: Micikevicius et al. 2018, "Mixed precision training", section 3.1 (an FP32 master copy of the weights
receives the update; the model computes in half precision); MosaicBERT and most large-model trainers keep bf16
weights the same way. Compared with autocast over float32 parameters, nothing is cast inside the step: autocast
casts every weight and bias before each Linear and LayerNorm and their gradients back (four extra operations per
Linear: half of a BERT layer's operations, each costing the host ~30 us to launch on the GPU); what that saves on
an H100, as predicted: docs/performance.md, "The H100 step, predicted".

The optimizer holds the float32 masters (its state is theirs, so checkpoints and exact resume are as in float32
training). They live on the parameters' device: build :class:`MasterWeights` after the model is on its device (the
trainer moves it first; an optimizer step over CPU masters of a GPU model would copy every gradient to the host and
run AdamW there). Gradients are accumulated in float32, as Megatron-LM's ``main_grad``: after each micro-batch's
backward, :meth:`MasterWeights.accumulate_gradients` adds the bf16 gradients into the masters' float32 gradients
(one contiguous buffer) and releases them, so the sum of ``grad_accum_steps`` micro-batches is rounded once, in
float32, not at every addition in bf16. Across processes the same buffer is all-reduced in float32 (the trainer
keeps DDP from reducing the bf16 gradients), overlapped with the last micro-batch's backward: armed by
:meth:`MasterWeights.begin_backward`, hooks on the parameters add each bucket of gradients (~25 MB of float32, the
last parameters first) into the buffer as soon as the backward has given them all, and on the step's last
micro-batch launch that bucket's asynchronous all-reduce; :meth:`MasterWeights.finish_gradients` launches the rest
and waits (training/reduction.py, which also says why this and not FSDP2). Then the masters are clipped and
stepped, and copied back into the bf16 weights. Checkpoints write the masters (:meth:`MasterWeights.float32_model`),
never the rounded weights.
"""

from __future__ import annotations

import contextlib
from typing import Iterable

import torch
from torch import nn

from vlbert.training import reduction
from vlbert.training.reduction import BucketedAllReduce, gradient_buckets


class MasterWeights:
    """Float32 masters of a model's parameters, on the parameters' device; the model itself is cast to ``dtype``.

    Args:
        model: a float32 module, already on the device it trains on; after construction its floating parameters
            and buffers are ``dtype``.
        dtype: the computing dtype (torch.bfloat16).
    Attributes:
        masters: list of float32 leaf tensors (requires_grad) on the parameters' devices, one per parameter of
            ``model`` in ``model.parameters()`` order; build the optimizer over these (:meth:`groups`). Their
            ``.grad`` are views of one contiguous float32 buffer (:attr:`grad_buffer`), set by
            :meth:`accumulate_gradients` (None for a parameter that had no gradient in the step).
        buckets: ranges of parameter indices, the last parameters first, about ``bucket_bytes`` of float32 each:
            the units in which gradients are accumulated during the backward and all-reduced
            (:func:`~vlbert.training.reduction.gradient_buckets`).
    ``bucket_bytes``: the float32 bytes of a bucket (default :data:`vlbert.training.reduction.BUCKET_BYTES`, 25 MiB
    as DDP, read when the masters are made).
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16, bucket_bytes: int | None = None):
        self.params = list(model.parameters())
        self.masters = [p.detach().clone().float().requires_grad_(p.requires_grad) for p in self.params]
        self._by_id = {id(p): m for p, m in zip(self.params, self.masters, strict=True)}
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self.grad_buffer: torch.Tensor | None = None  # float32 [sum of numels], allocated at the first gradient
        self._views: list[torch.Tensor] = []
        self._scratch: list[torch.Tensor] | None = None  # float32 copies of a later micro-batch's gradients
        self._seen: set[int] = set()  # parameters with a gradient in this step's micro-batches so far
        model.to(dtype)
        numels = [m.numel() for m in self.masters]
        self.buckets = gradient_buckets(numels, max(1, (bucket_bytes or reduction.BUCKET_BYTES) // 4))
        offsets = [0]
        for n in numels:
            offsets.append(offsets[-1] + n)
        self._slices = [(offsets[b.start], offsets[b.stop]) for b in self.buckets]
        self._bucket_of = {i: b for b, indices in enumerate(self.buckets) for i in indices}
        self._hooked = [sum(self.params[i].requires_grad for i in indices) for indices in self.buckets]
        self._armed = False  # between begin_backward and accumulate_gradients: the hooks accumulate
        self._missing: list[int] = []  # per bucket, its parameters the running backward has not given yet
        self._given: set[int] = set()  # parameters the running backward has given
        self._idle: set[int] = set()  # parameters the running backward's micro-batch does not use
        self.reduction: BucketedAllReduce | None = None  # the step's all-reduce, from its last micro-batch on
        for i, p in enumerate(self.params):
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._gradient_hook(i))

    def groups(self, groups: list[dict]) -> list[dict]:
        """Optimizer parameter groups over the model's parameters -> the same groups over their masters."""
        return [{**g, "params": [self._by_id[id(p)] for p in g["params"]]} for g in groups]

    def master_of(self, parameter: torch.Tensor) -> torch.Tensor:
        """The float32 master of one of the model's parameters."""
        return self._by_id[id(parameter)]

    def _allocate(self) -> None:
        devices = {m.device for m in self.masters}
        if len(devices) != 1:
            raise ValueError(
                f"the model's parameters are on several devices ({sorted(map(str, devices))}); "
                "bf16-params trains a model on one device"
            )
        self.grad_buffer = torch.zeros(sum(m.numel() for m in self.masters), dtype=torch.float32, device=devices.pop())
        self._views = [
            v.view_as(m)
            for v, m in zip(self.grad_buffer.split([m.numel() for m in self.masters]), self.masters, strict=True)
        ]

    @torch.no_grad()
    def begin_backward(self, reduce: bool = False, idle: Iterable[torch.Tensor] = ()) -> None:
        """Arm the hooks for the next backward (call before each micro-batch's backward): as soon as the backward
        has given every gradient of a bucket, the bucket's bf16 gradients are added into the float32 buffer and
        released; with ``reduce`` (the step's last micro-batch, several processes) the bucket's all-reduce is then
        launched, in bucket order (:class:`~vlbert.training.reduction.BucketedAllReduce`). ``idle``: the model's
        parameters this micro-batch does not use (``ObjectiveOutput.unused_parameters``): their gradient is zero, so
        their buckets do not wait for them, and a zero gradient the backward gives them anyway (the idle term that
        keeps them in DDP's graph) is released, not added. A backward outside ``begin_backward`` ..
        :meth:`accumulate_gradients` leaves ``.grad`` as autograd does.

        Raises RuntimeError if a reduction was started by an earlier micro-batch of the step (the all-reduced
        buffer must not receive more gradients: ``reduce`` belongs to the last micro-batch only)."""
        if self.reduction is not None:
            raise RuntimeError(
                "the step's gradient all-reduce already started in an earlier micro-batch: call "
                "begin_backward(reduce=True) for the last micro-batch of a step only, then finish_gradients"
            )
        if self.grad_buffer is None:
            self._allocate()
        indices = (self._index.get(id(p)) for p in idle)  # (a tensor not of this model is no parameter of it)
        self._idle = {i for i in indices if i is not None and self.params[i].requires_grad}
        self._armed, self._given, self._missing = True, set(), list(self._hooked)
        self.reduction = BucketedAllReduce(self.grad_buffer, self._slices) if reduce else None
        if reduce:  # an idle parameter without a gradient in the step so far: its slice is zero before it goes
            unseen = [self._views[i] for i in self._idle if i not in self._seen]
            if unseen:
                torch._foreach_zero_(unseen)
        for i in sorted(self._idle):
            self._missing[self._bucket_of[i]] -= 1
        for bucket, missing in enumerate(self._missing):
            if missing == 0 and self._hooked[bucket]:
                self._bucket_filled(bucket)

    def _gradient_hook(self, index: int):
        """The post-accumulate-grad hook of parameter ``index``."""

        def hook(parameter: torch.Tensor) -> None:
            if self._armed:
                self._gradient_given(index)

        return hook

    @torch.no_grad()
    def _gradient_given(self, index: int) -> None:
        """The backward has given parameter ``index`` its gradient: when that completes its bucket, accumulate the
        bucket (and launch its all-reduce if the step's reduction has begun)."""
        if index in self._idle:  # zero by the model's declaration; its bucket did not wait for it
            self.params[index].grad = None
            return
        if index in self._given:
            raise RuntimeError(
                f"parameter {index} {tuple(self.params[index].shape)} received its gradient twice in one backward "
                "(a reentrant activation checkpoint?): bf16-params accumulates each gradient once per backward; "
                "use torch.utils.checkpoint with use_reentrant=False"
            )
        self._given.add(index)
        bucket = self._bucket_of[index]
        self._missing[bucket] -= 1
        if self._missing[bucket] == 0:
            self._bucket_filled(bucket)

    def _bucket_filled(self, bucket: int) -> None:
        """Every parameter of ``bucket`` has its gradient of this backward (or is idle): accumulate, and launch the
        bucket's all-reduce if the step's reduction has begun."""
        self._accumulate([i for i in self.buckets[bucket] if self.params[i].grad is not None])
        if self.reduction is not None:
            self.reduction.ready(bucket)

    @torch.no_grad()
    def accumulate_gradients(self) -> None:
        """Add the model's (bf16) gradients of one micro-batch into the float32 master gradients and release them
        (``p.grad = None``): the first micro-batch of a step copies, later ones add (each in fused ``_foreach``
        kernels). Call after every backward (what the hooks accumulated during it is already in; this adds the
        buckets the backward left incomplete and disarms the hooks); :meth:`finish_gradients` ends the step's
        accumulation."""
        if self.grad_buffer is None:
            self._allocate()
        self._armed = False
        self._accumulate([i for i, p in enumerate(self.params) if p.grad is not None])

    def _accumulate(self, present: list[int]) -> None:
        """Copy (first micro-batch of the step) or add (later ones) the bf16 gradients of parameters ``present``
        into their float32 views, and release them."""
        fresh = [i for i in present if i not in self._seen]
        again = [i for i in present if i in self._seen]
        if fresh:
            torch._foreach_copy_([self._views[i] for i in fresh], [self.params[i].grad for i in fresh])
        if again:
            if self._scratch is None:
                self._scratch = [torch.empty_like(m) for m in self.masters]
            scratch = [self._scratch[i] for i in again]
            torch._foreach_copy_(scratch, [self.params[i].grad for i in again])
            torch._foreach_add_([self._views[i] for i in again], scratch)
        self._seen.update(fresh)
        for i in present:
            self.params[i].grad = None

    @torch.no_grad()
    def finish_gradients(self, world_size: int = 1) -> None:
        """End the step's accumulation: masters' ``.grad`` = their float32 sums (views of :attr:`grad_buffer`),
        None where no micro-batch gave the parameter a gradient (the optimizer then skips it, as it would the
        model's; its slice of the buffer is zeroed so that an all-reduce adds nothing to it); with several
        processes (``world_size``) averaged over them in float32, bucket by bucket: the buckets the last
        backward launched (:meth:`begin_backward` with ``reduce``) and the rest, launched now; then it waits for them
        (collective: every process calls it). The sum is the one-shot :meth:`all_reduce_gradients`'s."""
        if self.grad_buffer is None:
            self._allocate()
        reduction, self.reduction = self.reduction, None
        launched = {i for b in (reduction.launched if reduction else ()) for i in self.buckets[b]}
        # zeroed before their buckets go (an absent parameter in a bucket launched already: an idle one, zeroed
        # by begin_backward; writing it now would race the all-reduce)
        absent = [i for i in range(len(self.masters)) if i not in self._seen and i not in launched]
        if absent:
            torch._foreach_zero_([self._views[i] for i in absent])
        for i, m in enumerate(self.masters):
            m.grad = self._views[i] if i in self._seen else None
        self._seen = set()
        if world_size > 1 or reduction is not None:
            (reduction or BucketedAllReduce(self.grad_buffer, self._slices)).finish()
        if world_size > 1:
            self.grad_buffer.div_(world_size)

    @torch.no_grad()
    def all_reduce_gradients(self, world_size: int) -> None:
        """Average :attr:`grad_buffer` over the ``world_size`` processes of the default process group, in float32,
        in one all-reduce of the whole buffer after the backward (what DDP computes, without rounding the sum to
        bf16; the reference of the bucketed :meth:`finish_gradients`). Collective: every process calls it."""
        torch.distributed.all_reduce(self.grad_buffer)
        self.grad_buffer.div_(world_size)

    @torch.no_grad()
    def masters_to_model(self) -> None:
        """Round the updated masters into the model's weights (one fused copy)."""
        torch._foreach_copy_(self.params, self.masters)

    def misplaced(self, optimizer: torch.optim.Optimizer) -> list[str]:
        """Masters, master gradients and optimizer states that are not on their parameter's device (one line
        each; empty when all is in place). Reads devices only: no synchronisation."""
        errors = []
        for i, (p, m) in enumerate(zip(self.params, self.masters, strict=True)):
            for what, t in (
                ("master", m),
                ("master gradient", m.grad),
                *((f"optimizer state {k}", v) for k, v in optimizer.state.get(m, {}).items()),
            ):
                # fused AdamW keeps its step counter on the parameter's device too; a CPU scalar is no copy
                if (
                    torch.is_tensor(t)
                    and t.device != p.device
                    and not (t.dim() == 0 and t.device.type == "cpu" and what.endswith("step"))
                ):
                    errors.append(
                        f"{what} of parameter {i} {tuple(p.shape)} on {t.device}, the parameter on {p.device}"
                    )
        return errors

    @contextlib.contextmanager
    def float32_model(self):
        """Within the block the model's parameters *are* the float32 masters (shared storage): saving writes the
        masters, loading writes into them. On exit the weights are the masters rounded to the model's dtype."""
        kept = [p.data for p in self.params]
        try:
            for p, m in zip(self.params, self.masters, strict=True):
                p.data = m.data
            yield
        finally:
            for p, data in zip(self.params, kept, strict=True):
                p.data = data
            self.masters_to_model()


def check_placement(
    model: nn.Module, device: torch.device, master: MasterWeights | None, optimizer: torch.optim.Optimizer
) -> None:
    """Raise RuntimeError if a parameter of ``model``, a float32 master, a gradient or an optimizer state is not
    on the training ``device`` (the trainer calls it after its first step; devices are read, nothing copied)."""
    errors = [f"parameter {n} on {p.device}" for n, p in model.named_parameters() if p.device.type != device.type]
    if master is not None:
        errors += master.misplaced(optimizer)
    if errors:
        raise RuntimeError(
            f"training on {device}, but: "
            + "; ".join(errors[:5])
            + (f" (and {len(errors) - 5} more)" if len(errors) > 5 else "")
            + ": a bug in the trainer's placement, please report it"
        )


__all__ = ["MasterWeights", "check_placement"]
