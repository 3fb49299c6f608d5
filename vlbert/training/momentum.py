"""ALBEF's momentum model as a trainer hook (:class:`~vlbert.objectives.momentum.MomentumTeacher`: the copy, its
queue, the distillation weights): made from the model's weights when training starts, hung on the model for the
``itc`` and ``mlm`` units, moved towards the weights after every optimizer step (foreach operations on the device,
no host read), and saved in every checkpoint with its queue, so a resumed run continues exactly."""

from __future__ import annotations

import torch

from vlbert.objectives.momentum import MomentumOptions, MomentumTeacher, attach
from vlbert.training.hooks import TrainerHook


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
        self._sources: list[torch.Tensor] = []

    def _weights(self, trainer) -> list[torch.Tensor]:
        """The model's parameters the teacher copies, in its order: the float32 masters where the trainer keeps
        them (bf16 weights), else the parameters."""
        model = trainer.unwrapped
        master = getattr(trainer, "master", None)
        params = master.masters if master else list(model.parameters())
        index = {name: i for i, (name, _) in enumerate(model.named_parameters())}
        return [params[index[name]].detach() for name in self.teacher.names]

    def before_train(self, trainer) -> None:
        if self.teacher is None:
            self.teacher = MomentumTeacher(trainer.unwrapped, self.options, self.seed)
            self._sources = self._weights(trainer)
            if self._state is not None:
                self.teacher.load_state_dict(self._state)
                self._state = None
            else:
                self.teacher.start_from(self._sources)
        attach(trainer.unwrapped, self.teacher)

    def before_step(self, trainer) -> None:
        self.teacher.step = trainer.step

    def after_step(self, trainer) -> None:
        self.teacher.update(self._sources)

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


__all__ = ["MomentumDistillation", "MomentumOptions"]
