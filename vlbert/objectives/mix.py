"""The objective mix of VL pretraining: one objective per optimizer step, drawn from configured weights, the
same on every rank (UNITER's MetaLoader draws one task per step for all processes)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from vlbert.objectives.registry import OBJECTIVES


@dataclass
class ObjectiveMix:
    """Relative frequencies of the objectives (YAML ``data.objectives``, e.g. ``{mlm: 2, mrfr: 1, itm: 1}``). A
    paired unit's entry (``wra: 0.1``) is not a frequency but its loss weight on its partner's batches (UNITER's
    ``itm_ot_lambda``).

    Raises:
        ValueError: an unknown objective name, a negative weight, no positive weight, or a paired unit whose
            partner has no weight.
    """

    weights: dict[str, float]

    def __post_init__(self) -> None:
        unknown = sorted(set(self.weights) - set(OBJECTIVES))
        if unknown or not self.weights:
            raise ValueError(f"unknown objective(s) {unknown}; the objectives are {sorted(OBJECTIVES)}")
        bad = {
            n: w
            for n, w in self.weights.items()
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not w >= 0
        }
        if bad:
            raise ValueError(f"data.objectives weights must be numbers >= 0, got {bad}; e.g. {{mlm: 2, itm: 1}}")
        for name in self.paired:
            partner = OBJECTIVES[name].paired_with
            if self.weights.get(partner, 0) <= 0:
                raise ValueError(
                    f"data.objectives.{name} runs on {partner} batches (its weight is a loss weight "
                    f"there), and {partner} has no positive weight: add {partner}, e.g. "
                    f"{{{partner}: 1, {name}: {self.weights[name]}}}"
                )
        if sum(self.weights[n] for n in self.active) <= 0:
            raise ValueError(
                f"data.objectives gives no objective a positive weight ({self.weights}); e.g. {{mlm: 2, itm: 1}}"
            )

    @property
    def active(self) -> list[str]:
        """The objectives drawn for steps (positive weight, not paired), in configuration order."""
        return [name for name, weight in self.weights.items() if weight > 0 and not OBJECTIVES[name].paired_with]

    @property
    def paired(self) -> list[str]:
        """The paired units with a positive loss weight (they run on their partner's batches)."""
        return [name for name, weight in self.weights.items() if weight > 0 and OBJECTIVES[name].paired_with]

    def runs_on(self, objective: str) -> list[str]:
        """The paired units that run on the batches of ``objective``."""
        return [name for name in self.paired if OBJECTIVES[name].paired_with == objective]

    def draw(self, seed: int, epoch: int, step: int) -> str:
        """The objective of optimizer step ``step`` of ``epoch``: a function of (seed, epoch, step) and of the
        weights in their configuration order (the order of :attr:`active`), so every rank, and a resumed run, draws
        the same. The same weights written in another order draw another schedule (``{mlm: 1, itm: 1}`` is not
        ``{itm: 1, mlm: 1}``): a config passed through a writer that sorts keys (``yaml.safe_dump``'s default)
        trains other objectives at the same steps."""
        names = self.active
        return random.Random(f"objective-{seed}-{epoch}-{step}").choices(
            names, weights=[self.weights[n] for n in names]
        )[0]


__all__ = ["ObjectiveMix"]
