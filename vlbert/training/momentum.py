"""ALBEF's momentum model as a trainer hook (:class:`~vlbert.objectives.momentum.MomentumTeacher`: the copy, its
queue, the distillation weights): made from the model's weights when training starts, hung on the model for the
``itc`` and ``mlm`` units, moved towards the weights after every optimizer step (foreach operations on the device,
no host read), and saved in every checkpoint with its queue, so a resumed run continues exactly. With bf16-params
(FSDP2, any number of processes) the copy is sharded as the model (:func:`~vlbert.training.sharding.shard_like`):
each rank moves its float32 shards towards the model's float32 shards of the same elements."""

from __future__ import annotations

import functools

import torch

from vlbert.objectives.momentum import MomentumOptions, MomentumTeacher, attach
from vlbert.training.hooks import TrainerHook
from vlbert.training.sharding import shard_like


class MomentumDistillation(TrainerHook):
    """Keeps ``trainer.unwrapped``'s momentum teacher (``options``: :class:`MomentumOptions`; ``seed``: the
    queue's random start, the same on every rank).

    Attributes:
        teacher: the :class:`MomentumTeacher` (None before training starts).
    """

    def __init__(self, options: MomentumOptions, seed: int = 0):
        self.options, self.seed = options, seed
        self.teacher: MomentumTeacher | None = None
        self._state: dict | None = None  # a checkpoint's, taken back before the teacher exists

    def _weights(self, trainer) -> list[torch.Tensor]:
        """The model's float32 weights the teacher follows, in its order: the parameters, or with bf16-params each
        float32 DTensor's local tensor (this rank's shard, laid out as the sharded teacher's), which the optimizer
        updates in place. Read anew at each call (views, no copy, no host read)."""
        model = trainer.unwrapped
        with torch.no_grad():
            params = {n: p.detach() for n, p in model.named_parameters()}
            return [_local(params[name]) for name in self.teacher.names]

    def before_train(self, trainer) -> None:
        sharded = bool(getattr(trainer, "sharded", False))
        if self.teacher is None:
            shard = None
            if sharded:
                shard = functools.partial(shard_like, model=trainer.unwrapped)
                for module in _fsdp_modules(trainer.unwrapped):
                    module.reshard()  # the float32 shards registered (a forward before training leaves bf16 ones)
            self.teacher = MomentumTeacher(trainer.unwrapped, self.options, self.seed, shard=shard)
            if self._state is not None:
                self.teacher.load_state_dict(self._state)
                self._state = None
            else:
                self.teacher.start_from(self._weights(trainer))
        attach(trainer.unwrapped, self.teacher)

    def before_step(self, trainer) -> None:
        self.teacher.step = trainer.step

    def after_step(self, trainer) -> None:
        self.teacher.update(self._weights(trainer))

    def after_train(self, trainer, metrics) -> None:
        attach(trainer.unwrapped, None)  # the final evaluation has run; the saved model carries no teacher

    def state_dict(self) -> dict:
        return self.teacher.state_dict() if self.teacher is not None else (self._state or {})

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        if self.teacher is None:
            self._state = state
        else:
            self.teacher.load_state_dict(state)


def _local(p: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor (this rank's shard), or ``p``."""
    return p.to_local() if hasattr(p, "device_mesh") else p


def _fsdp_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


__all__ = ["MomentumDistillation"]
