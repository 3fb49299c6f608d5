"""The masking rate of MLM as a function of the optimizer step (``data.mlm_probability_schedule`` of text
pretraining).

Definition: with ``{f_1: r_1, f_2: r_2, ...}`` (step fractions f in [0, 1), rates r in (0, 1)) and ``max_steps`` N,
phase k starts at step ``ceil(f_k x N)``; the batches of optimizer step ``s`` (from 0) mask the rate of the last
phase started (``s >= ceil(f_k x N)``), and ``data.mlm_probability`` before the first (none where a fraction is 0). mmBERT's inverse mask-ratio
schedule is ``{0: 0.3, 0.767: 0.15, 0.967: 0.05}``: 30% in pretraining (2.3T of its 3T tokens), 15% in
mid-training (600B), 5% in the decay phase (100B) (Marone et al. 2025, "mmBERT: A Modern Multilingual Encoder with
Annealed Language Learning", arXiv 2509.06888). Ankner et al. 2023 ("Dynamic Masking Rate Schedules for MLM
Pretraining", arXiv 2305.15096) found a rate decreasing from 30% to 15% better than a fixed 15%.

The rate is chosen on the host when the loader builds the batch (each item carries its step's rate: the training
loader tags it, :func:`vlbert.data.loading.train_loader`'s ``step_fields``), so a step never waits on the device,
and a resumed run, which restarts the loader at its step, masks every batch as an uninterrupted one.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class MaskingSchedule:
    """The masking rate of each optimizer step (module docstring).

    Args:
        rates: step fraction -> rate (float keys in [0, 1), values in (0, 1)); empty: ``default`` throughout.
        max_steps: the run's optimizer steps (``training.max_steps``).
        default: the rate before the first fraction (``data.mlm_probability``).

    Raises:
        ValueError: a fraction outside [0, 1) or a rate outside (0, 1) (one line naming the key).
    """

    rates: dict[float, float]
    max_steps: int
    default: float = 0.15

    def __post_init__(self) -> None:
        for fraction, rate in self.rates.items():
            if not 0.0 <= fraction < 1.0:
                raise ValueError(
                    f"data.mlm_probability_schedule's keys are step fractions in [0, 1), got {fraction}; "
                    "e.g. {0: 0.3, 0.767: 0.15, 0.967: 0.05}"
                )
            if not 0.0 < rate < 1.0:
                raise ValueError(f"data.mlm_probability_schedule[{fraction}] must be a rate in (0, 1), got {rate}")

    def rate(self, step: int) -> float:
        """The masking rate of optimizer step ``step`` (int, from 0): a float in (0, 1)."""
        fractions = sorted(self.rates)
        k = bisect.bisect_right([self.first_step(f) for f in fractions], step)
        return self.rates[fractions[k - 1]] if k else self.default

    def first_step(self, fraction: float) -> int:
        """``ceil(fraction x max_steps)``, the first step of the phase starting at ``fraction`` (the product rounded
        to 9 decimals first, so that 0.767 x 1000 is step 767)."""
        return math.ceil(round(fraction * self.max_steps, 9))

    def fields(self, step: int) -> dict[str, float]:
        """What every item of step ``step``'s batches carries: ``{"mlm_probability": rate}``, read by
        :class:`~vlbert.data.pretraining.MaskingCollator`."""
        return {"mlm_probability": self.rate(step)}


__all__ = ["MaskingSchedule"]
