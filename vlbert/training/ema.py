"""An exponential moving average of the weights as a trainer hook (Polyak & Juditsky 1992; the EMA that
timm's ``ModelEmaV2`` and many pretraining recipes keep), and the example of a hook with state: the average is
saved in every checkpoint, so a resumed run continues it exactly."""

from __future__ import annotations

import torch

from vlbert.training.hooks import TrainerHook
from vlbert.training.sharding import full_tensor


class EMAHook(TrainerHook):
    """After every optimizer step, ``shadow = decay * shadow + (1 - decay) * weights`` (one fused ``lerp`` over
    all parameters, float32: with bf16-params the sharded float32 weights, each rank averaging its shards), starting
    from the weights of the first step this run sees.

    Args:
        decay: in [0, 1), e.g. 0.999 (an average over about 1 / (1 - decay) steps).
    Attributes:
        shadow: list of float32 tensors in ``model.parameters()`` order, placed as the parameters (a sharded
            model's shards) (None before training).
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
        return [p.detach() for p in trainer.unwrapped.parameters()]

    def before_train(self, trainer) -> None:
        weights = self._weights(trainer)
        if self.shadow is None:
            self.shadow = [w.float().clone() for w in weights]
        else:  # a resumed average (whole CPU tensors): placed as the weights, a sharded model's shards taken
            self.shadow = [_placed_as(s.float(), w) for s, w in zip(self.shadow, weights, strict=True)]

    @torch.no_grad()
    def after_step(self, trainer) -> None:
        torch._foreach_lerp_(self.shadow, [w.float() for w in self._weights(trainer)], 1.0 - self.decay)
        self.updates += 1

    def state_dict(self) -> dict:
        """The average as whole CPU tensors (a sharded model's gathered: collective, every rank calls it)."""
        shadow = None if self.shadow is None else [full_tensor(t).cpu() for t in self.shadow]
        return {"shadow": shadow, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.updates = state["updates"]
        self.shadow = None if state["shadow"] is None else [t.clone() for t in state["shadow"]]

    @torch.no_grad()
    def copy_to(self, model: torch.nn.Module) -> None:
        """Write the average into ``model``'s parameters (same architecture), e.g. to evaluate or save it."""
        for p, s in zip(model.parameters(), self.shadow, strict=True):
            p.copy_(_placed_as(full_tensor(s), p))


def _placed_as(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``whole`` on ``like``'s device, and sharded as ``like`` where that is a DTensor (every rank keeps its shard of
    the same whole tensor)."""
    if hasattr(like, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(whole.to(like.device_mesh.device_type), like.device_mesh, like.placements)
    return whole.to(like.device)


__all__ = ["EMAHook"]
