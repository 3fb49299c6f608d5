"""ALBEF's momentum model as a trainer hook (:class:`~vlbert.objectives.momentum.MomentumTeacher`: the copy, its
queue, the distillation weights): made from the model's weights when training starts, hung on the model for the
``itc`` and ``mlm`` units, moved towards the weights after every optimizer step (foreach operations on the device,
no host read), and saved in every checkpoint with its queue, so a resumed run continues exactly."""

from __future__ import annotations

import torch

from vlbert.objectives.momentum import MomentumOptions, MomentumTeacher, attach
from vlbert.training.hooks import TrainerHook
from vlbert.training.sharding import COMPUTE_DTYPE


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
        """The model's float32 weights the teacher follows, in its order: the parameters, or with bf16-params
        (FSDP2 on one rank) each float32 DTensor's local tensor, which is the whole weight and which the optimizer
        updates in place. Read anew at each call (views, no copy, no host read)."""
        model = trainer.unwrapped
        with torch.no_grad():
            params = {n: p.detach() for n, p in model.named_parameters()}
            return [_local(params[name]) for name in self.teacher.names]

    def before_train(self, trainer) -> None:
        sharded = bool(getattr(trainer, "sharded", False))
        check_processes(sharded, trainer.accelerator.num_processes)
        if self.teacher is None:
            dtype = None
            if sharded:
                dtype = COMPUTE_DTYPE
                for module in _fsdp_modules(trainer.unwrapped):
                    module.reshard()  # the float32 shards registered (a forward before training leaves bf16 ones)
            self.teacher = MomentumTeacher(trainer.unwrapped, self.options, self.seed, compute_dtype=dtype)
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


def check_processes(sharded: bool, processes: int) -> None:
    """Refuse ALBEF's momentum model with bf16-params (FSDP2) on several processes: its copy would be built and
    followed from whole weights, which sharded ones are only through a gather of every parameter each step (not
    built yet). One process (a one-rank group: each shard is the whole weight) and float32 or bf16-autocast runs on
    any number of processes are supported.

    Raises:
        ValueError: ``sharded`` and ``processes`` > 1 (one line naming the settings that work)."""
    if sharded and processes > 1:
        raise ValueError(
            "ALBEF momentum distillation (data.itc.momentum) with training.mixed_precision: bf16-params on several "
            "processes is not supported yet: set training.mixed_precision: bf16 (or no), or run one process"
        )


def _local(p: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor (a one-rank shard: the whole weight), or ``p``."""
    return p.to_local() if hasattr(p, "device_mesh") else p


def _fsdp_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


__all__ = ["MomentumDistillation", "check_processes"]
