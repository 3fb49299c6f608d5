"""An exponential moving average of the weights as a trainer hook (Polyak & Juditsky 1992; the EMA that
timm's ``ModelEmaV2`` and many pretraining recipes keep), and the example of a hook with state: the average is
saved in every checkpoint, so a resumed run continues it exactly."""

from __future__ import annotations

import torch

from vlbert.training.hooks import TrainerHook


class EMAHook(TrainerHook):
    """After every optimizer step, ``shadow = decay * shadow + (1 - decay) * weights`` (one fused ``lerp`` over
    all parameters, float32: the masters when the weights are bf16), starting from the weights of the first step
    this run sees.

    Args:
        decay: in [0, 1), e.g. 0.999 (an average over about 1 / (1 - decay) steps).
    Attributes:
        shadow: list of float32 tensors in ``model.parameters()`` order (None before training).
        updates: the number of steps averaged.
    Raises:
        ValueError: a decay outside [0, 1).
    """

    def __init__(self, decay: float = 0.999):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.shadow: list[torch.Tensor] | None = None
        self.updates = 0

    @staticmethod
    def _weights(trainer) -> list[torch.Tensor]:
        params = trainer.master.masters if trainer.master else list(trainer.unwrapped.parameters())
        return [p.detach() for p in params]

    def before_train(self, trainer) -> None:
        if self.shadow is None:
            self.shadow = [w.float().clone() for w in self._weights(trainer)]

    @torch.no_grad()
    def after_step(self, trainer) -> None:
        torch._foreach_lerp_(self.shadow, [w.float() for w in self._weights(trainer)], 1.0 - self.decay)
        self.updates += 1

    def state_dict(self) -> dict:
        return {"shadow": [t.cpu() for t in self.shadow] if self.shadow is not None else None, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.updates = state["updates"]
        self.shadow = None if state["shadow"] is None else [t.clone() for t in state["shadow"]]

    @torch.no_grad()
    def copy_to(self, model: torch.nn.Module) -> None:
        """Write the average into ``model``'s parameters (same architecture), e.g. to evaluate or save it."""
        for p, s in zip(model.parameters(), self.shadow, strict=True):
            p.copy_(s)


__all__ = ["EMAHook"]
