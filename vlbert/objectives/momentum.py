"""ALBEF's momentum distillation (Li et al. 2021, section 3.3; salesforce/ALBEF@b9727e4 ``models/model_pretrain.py``
and ``Pretrain.py``): a momentum copy of the parts ITC and MLM read (the encoder, the ``itc`` projections, the
``masked_lm`` head), its features' queue for ITC, and the weight ``alpha`` of its soft targets.

The copy follows the weights as an exponential moving average, ``m = decay * m + (1 - decay) * w`` after every
optimizer step (ALBEF's ``_momentum_update`` before each forward: the same sequence of weights), in float32, with
foreach operations and no host read. With bf16-params (FSDP2) the copy is sharded as the model is: each rank holds
and moves the float32 shard of each momentum weight that matches its shard of the model's weight, and the copy's
forward gathers bfloat16 weights as the model's does. The queue
holds the momentum features of the last ``queue_size`` captions and images of the global batch, with each caption's
content id (ALBEF's ``idx_queue`` of retrieval fine-tuning; ``model_pretrain.py`` has none, its captions are all
negatives of each other), starting as ALBEF's: random unit vectors (content -1, no caption's). ``alpha`` rises
linearly from 0 over ``alpha_ramp_steps`` steps (ALBEF: ``alpha * min(1, i / len(data_loader))`` over its first
epoch). Everything is in :meth:`MomentumTeacher.state_dict`, so a resumed run continues exactly.

The units find the teacher on the model (:func:`teacher_of`) while it trains; held-out passes (the model in eval
mode) use none: their loss is the plain one, comparable between runs with and without distillation.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import nn

from vlbert.common.typed_config import Range

#: the parts of a pretraining model the teacher copies (those ITC and MLM read), where the model has them
PARTS = ("bert", "itc", "masked_lm")
#: the model attribute the teacher hangs on (a plain attribute: not a submodule, not in the model's weights)
ATTRIBUTE = "momentum_teacher"


@dataclass
class MomentumOptions:
    """ALBEF's momentum distillation (YAML ``data.itc``; ALBEF's values: configs/Pretrain.yaml at b9727e4).

    Attributes:
        momentum: the EMA decay of the momentum model, in [0, 1); 0 = no momentum model (ALBEF: 0.995).
        queue_size: features of each modality kept from past global batches as ITC's extra columns, 0 = none
            (ALBEF: 65,536); at least the global batch.
        alpha: weight of the momentum model's soft targets in ITC's targets, in [0, 1] (ALBEF: 0.4).
        mlm_alpha: weight of the momentum model's soft labels in MLM's loss, in [0, 1] (ALBEF uses its one
            ``alpha`` for both: 0.4).
        alpha_ramp_steps: steps over which both weights rise linearly from 0 (ALBEF: its first epoch); 0 = none.
    Raises:
        ValueError: a queue or an alpha without a momentum model.
    """

    momentum: Annotated[float, Range(ge=0, lt=1)] = 0.0
    queue_size: Annotated[int, Range(ge=0)] = 0
    alpha: Annotated[float, Range(ge=0, le=1)] = 0.0
    mlm_alpha: Annotated[float, Range(ge=0, le=1)] = 0.0
    alpha_ramp_steps: Annotated[int, Range(ge=0)] = 0

    def __post_init__(self) -> None:
        if not self.momentum and (self.queue_size or self.alpha or self.mlm_alpha):
            raise ValueError(
                "data.itc.queue_size, alpha and mlm_alpha use the momentum model's features: set data.itc.momentum "
                "(ALBEF: 0.995) or leave them 0"
            )

    @property
    def enabled(self) -> bool:
        """Whether a momentum model is kept."""
        return self.momentum > 0


class Parts(nn.Module):
    """The momentum model's parts as attributes (``bert``, ``itc``, ``masked_lm``); its forward runs a function of
    it, ``parts(fn) = fn(parts)``: the one entry through which a sharded copy gathers its weights
    (:meth:`MomentumTeacher.run`)."""

    def forward(self, fn):
        return fn(self)


class MomentumTeacher:
    """The momentum model of ``model`` (its :data:`PARTS`, deep copies without gradient, on its device), the ITC
    queue and the distillation weights at the current step.

    A part sharded by FSDP2 (the trainer's bf16-params, :mod:`vlbert.training.sharding`) is copied as a module of
    its own class without FSDP's hooks and state, each parameter its whole float32 weight (``full_tensor()``:
    collective, every rank builds the teacher together); ``shard`` (given with a sharded model:
    :func:`vlbert.training.sharding.shard_like`) then shards the copy as the model, so each rank keeps the float32
    shards of its own part of every weight: :attr:`shadow` (the shards' local tensors) is what :meth:`update` moves,
    and :meth:`run` gathers them, in the model's computing dtype, for each forward.

    Attributes:
        module: :class:`Parts` with the copied parts as attributes (``module.bert``, ``module.itc``, ...); call
            its parts through :meth:`run` (a sharded copy's weights are whole only there).
        sharded: whether ``module`` is sharded (``shard``, a function sharding the copy in place and returning it,
            was given).
        text_queue, image_queue: float32 [queue_size, projection_dim] unit vectors; content_queue: int64
            [queue_size]; pointer: the next row written (host int).
        step: optimizer steps done (set by the trainer hook before each step: the ramp reads it).
        updates: momentum updates done.
    """

    def __init__(
        self,
        model: nn.Module,
        options: MomentumOptions,
        seed: int = 0,
        shard: Callable[[nn.Module], nn.Module] | None = None,
    ):
        self.options = options
        self.module = Parts()
        compiled = {m: m._compiled_call_impl for m in model.modules() if m._compiled_call_impl is not None}
        try:  # copied without the compiled forwards (a copy would call the original's), which do not copy
            for m in compiled:
                m._compiled_call_impl = None
            for name in PARTS:
                part = getattr(model, name, None)
                if part is not None:
                    setattr(self.module, name, _copy(part))
        finally:
            for m, call in compiled.items():
                m._compiled_call_impl = call
        self.sharded = shard is not None
        if self.sharded:
            self.module = shard(self.module)
        self.module.requires_grad_(False)
        self.names = [n for n, _ in self.module.named_parameters()]
        # float32 parameters (a sharded copy's always) are their own shadow; others follow a float32 one
        self._shadow = None if self.sharded else [p.detach().float() for p in self.module.parameters()]
        self.step, self.updates, self.pointer = 0, 0, 0
        self.text_queue = self.image_queue = self.content_queue = None
        if options.queue_size:
            head = getattr(model, "itc", None)
            if head is None:
                raise ValueError("data.itc.queue_size needs the itc objective in data.objectives (its projections)")
            g = torch.Generator().manual_seed(seed)
            size, dim = options.queue_size, head.text_proj.out_features
            device = head.text_proj.weight.device
            self.text_queue = F.normalize(torch.randn(size, dim, generator=g, dtype=torch.float32), dim=-1).to(device)
            self.image_queue = F.normalize(torch.randn(size, dim, generator=g, dtype=torch.float32), dim=-1).to(device)
            self.content_queue = torch.full((size,), -1, dtype=torch.long, device=device)

    @property
    def shadow(self) -> list[torch.Tensor]:
        """The float32 momentum weights in :attr:`names` order: a sharded copy's local shards (views of the
        weights its forward gathers: read anew at each call), else each parameter or its float32 shadow."""
        if self.sharded:
            return [p.detach().to_local() for p in self.module.parameters()]
        return self._shadow

    def run(self, fn):
        """``fn(parts)`` (``parts``: :attr:`module`) through the copy's forward: a sharded copy's weights are
        gathered for it (collective: every rank runs the same forwards, as the units do) and freed after it."""
        return self.module(fn)

    @torch.no_grad()
    def start_from(self, weights: list[torch.Tensor]) -> None:
        """The copy set to ``weights`` (each part's parameters in :attr:`names` order, float32 where the model's are;
        with bf16-params each rank's float32 shards, not the bfloat16 weights the model computes with), as ALBEF's
        ``copy_params``."""
        torch._foreach_copy_(self.shadow, [w.float() for w in weights])
        self._shadow_to_module()

    def alpha(self, which: str = "itc") -> float:
        """ITC's (``which`` "itc") or MLM's ("mlm") distillation weight at :attr:`step`: the option times
        ``min(1, step / alpha_ramp_steps)`` (ALBEF ``Pretrain.py``: ``alpha * min(1, i / len(data_loader))`` in
        the first epoch, ``i`` the iterations done)."""
        o = self.options
        weight = o.alpha if which == "itc" else o.mlm_alpha
        return weight * min(1.0, self.step / o.alpha_ramp_steps) if o.alpha_ramp_steps else weight

    def sync_mode(self, model: nn.Module) -> None:
        """The copy in ``model``'s train/eval mode (ALBEF's momentum encoders are submodules: they follow it)."""
        if self.module.training != model.training:
            self.module.train(model.training)

    @torch.no_grad()
    def update(self, weights: list[torch.Tensor]) -> None:
        """``shadow = decay * shadow + (1 - decay) * weights`` (float32 [each part's parameters], in
        :attr:`names` order), then the copy's parameters from the shadow where they are not float32. No host read."""
        torch._foreach_lerp_(self.shadow, [w.float() for w in weights], 1.0 - self.options.momentum)
        self._shadow_to_module()
        self.updates += 1

    def _shadow_to_module(self) -> None:
        params = list(self.module.parameters())
        if not self.sharded and any(p.dtype != torch.float32 for p in params):
            torch._foreach_copy_(params, self.shadow)

    @torch.no_grad()
    def enqueue(self, text: torch.Tensor, image: torch.Tensor, content: torch.Tensor) -> None:
        """Write the global batch's momentum features (float [n, P] each) and content ids (int64 [n]) at
        :attr:`pointer`, wrapping around (ALBEF's ``_dequeue_and_enqueue``). The rows are chosen on the device.

        Raises:
            ValueError: a global batch larger than the queue."""
        n, size = text.shape[0], self.options.queue_size
        if n > size:
            raise ValueError(f"data.itc.queue_size ({size}) must be at least the global batch ({n} pairs)")
        rows = (torch.arange(n, device=text.device) + self.pointer) % size
        self.text_queue.index_copy_(0, rows, text.float())
        self.image_queue.index_copy_(0, rows, image.float())
        self.content_queue.index_copy_(0, rows, content)
        self.pointer = (self.pointer + n) % size

    def state_dict(self) -> dict:
        """The whole float32 shadow weights by name (a sharded copy's gathered: collective, every rank calls it),
        the queues, the pointer and the counters (host copies)."""
        queues = {k: getattr(self, k) for k in ("text_queue", "image_queue", "content_queue")}
        if self.sharded:
            shadow = [p.detach().full_tensor().cpu() for p in self.module.parameters()]
        else:
            shadow = [s.cpu() for s in self.shadow]
        return {
            "shadow": dict(zip(self.names, shadow, strict=True)),
            "queues": {k: None if v is None else v.cpu() for k, v in queues.items()},
            "pointer": self.pointer,
            "updates": self.updates,
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Take back :meth:`state_dict`, whatever number of processes wrote it (the copy's parameters and queues on
        their devices; a sharded copy's ranks each keep their shards)."""
        params = list(self.module.parameters())
        for name, s, p in zip(self.names, self.shadow, params, strict=True):  # (a 0-d weight is one element sharded)
            whole = state["shadow"][name].reshape(p.shape)
            s.copy_(_local_shard(whole, p) if self.sharded else whole)
        self._shadow_to_module()
        for key, value in state["queues"].items():
            if value is not None:
                getattr(self, key).copy_(value)
        self.pointer, self.updates = state["pointer"], state["updates"]


def _copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` whose parameters and buffers are plain clones (a tensor's own attributes, which
    the trainer or a fake device may have set, are not copied). Where FSDP2 sharded it, the copy is a plain module:
    each FSDP module of its original class, without FSDP's hooks and state (``fully_shard`` forbids deepcopy), its
    DTensor parameters whole (:func:`_whole`)."""
    from torch.distributed.fsdp import FSDPModule

    memo = {id(p): nn.Parameter(_whole(p), requires_grad=False) for p in module.parameters()}
    memo.update({id(b): b.detach().clone() for b in module.buffers()})
    for m in module.modules():  # FSDP's state and hooks left behind (its state's slots None until deleted below)
        memo.update({id(v): None for k, v in vars(m).items() if k.startswith("__composable_api_")})  # dicts
        fsdp = _fsdp_handles(m)  # hooks and their flags (``*_with_kwargs``, ``always_called``) by handle
        for d in (getattr(m, name) for name in _HOOK_DICTS):
            memo[id(d)] = type(d)((k, v) for k, v in d.items() if k not in fsdp)
    classes = {m: type(m) for m in module.modules() if isinstance(m, FSDPModule)}
    try:
        for m, cls in classes.items():
            m.__class__ = cls.__mro__[cls._orig_cls_mro_index]
        copied = copy.deepcopy(module, memo)
    finally:
        for m, cls in classes.items():
            m.__class__ = cls
    for m in copied.modules():
        for key in [k for k in vars(m) if _is_fsdp_key(k)]:
            delattr(m, key)
    return copied


#: the hook dictionaries of an ``nn.Module`` that FSDP2 adds to (its forward hooks, its parameters' load hooks)
_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_load_state_dict_post_hooks",
)


def _is_fsdp_key(key: str) -> bool:
    """Whether a module attribute is FSDP2's (its composable state and registry, its managed-module flags)."""
    return key.startswith("__composable_api_") or key in ("_is_fsdp_managed_module", "_fsdp_use_orig_params")


def _fsdp_handles(module: nn.Module) -> set[int]:
    """The handles of ``module``'s hooks that FSDP2 registered (functions defined in ``torch.distributed.fsdp``)."""
    return {
        handle
        for d in (module._forward_pre_hooks, module._forward_hooks, module._load_state_dict_post_hooks)
        for handle, hook in d.items()
        if getattr(hook, "__module__", "").startswith("torch.distributed.fsdp")
    }


def _whole(p: torch.Tensor) -> torch.Tensor:
    """A detached clone of ``p``, whole where it is a DTensor (``full_tensor()``: collective; on a one-rank mesh
    that is the shard itself, hence the clone)."""
    p = p.detach()
    return (p.full_tensor() if hasattr(p, "device_mesh") else p).clone()


def _local_shard(whole: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``whole`` as the DTensor ``p`` is laid out (its mesh and placements), without
    communication (every rank holds ``whole``)."""
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(whole.to(p.device), p.device_mesh, p.placements, src_data_rank=None).to_local()


def teacher_of(model: nn.Module) -> MomentumTeacher | None:
    """The momentum teacher on ``model`` while it trains, else None (evaluation: the plain losses)."""
    teacher = getattr(model, ATTRIBUTE, None)
    if teacher is None or not model.training:
        return None
    teacher.sync_mode(model)
    return teacher


def attach(model: nn.Module, teacher: MomentumTeacher | None) -> None:
    """Hang ``teacher`` on ``model`` (a plain attribute: not a submodule, not saved with the weights), or take it
    off (None)."""
    object.__setattr__(model, ATTRIBUTE, teacher)


__all__ = ["MomentumOptions", "MomentumTeacher", "Parts", "teacher_of", "attach", "PARTS"]
