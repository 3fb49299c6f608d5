"""The objective mix of VL pretraining: one objective per optimizer step, drawn from configured weights, the
same on every rank (UNITER's MetaLoader draws one task per step for all processes)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from vlbert.objectives.registry import OBJECTIVES


@dataclass
class ObjectiveMix:
    """Relative frequencies of the objectives (YAML ``data.objectives``, e.g. ``{mlm: 2, mrfr: 1, itm: 1}``).

    Raises:
        ValueError: an unknown objective name, a negative weight, or no positive weight.
    """

    weights: dict[str, float]

    def __post_init__(self) -> None:
        unknown = sorted(set(self.weights) - set(OBJECTIVES))
        if unknown or not self.weights:
            raise ValueError(f"unknown objective(s) {unknown}; the objectives are {sorted(OBJECTIVES)}")
        if any(w < 0 for w in self.weights.values()) or sum(self.weights.values()) <= 0:
            raise ValueError(f"objective weights must be >= 0 with a positive sum, got {self.weights}")

    @property
    def active(self) -> list[str]:
        """The objectives with a positive weight, in configuration order."""
        return [name for name, weight in self.weights.items() if weight > 0]

    def draw(self, seed: int, epoch: int, step: int) -> str:
        """The objective of optimizer step ``step`` of ``epoch``: a function of (seed, epoch, step) only, so every
        rank, and a resumed run, draws the same."""
        names = self.active
        return random.Random(f"objective-{seed}-{epoch}-{step}").choices(
            names, weights=[self.weights[n] for n in names])[0]


__all__ = ["ObjectiveMix"]
