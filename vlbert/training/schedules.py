"""The learning-rate schedule table (``training.schedule``): a name -> a :class:`Schedule` (the multiplier of
``training.learning_rate`` at each optimizer step, the checks of its settings and the hooks it adds to the
trainer). A new schedule is one module with such functions and one line in :data:`SCHEDULES`.

* ``linear`` (the default): linear warmup over ``warmup_steps``, then linear decay to 0 at ``max_steps`` (BERT,
  appendix A.2; :func:`linear_schedule`).
* ``wsd``: warmup-stable-decay (trapezoidal), with the end-of-stable checkpoint kept (:mod:`vlbert.training.wsd`,
  :mod:`vlbert.training.end_of_stable`; ModernBERT's ``warmup_stable_decay``).

The schedule is a function of the step alone (``torch.optim.lr_scheduler.LambdaLR``, its step saved in every
checkpoint), so a resumed run continues it exactly; it scales every parameter group alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from vlbert.training.end_of_stable import EndOfStableCheckpoint
from vlbert.training.wsd import check_wsd, decay_start, wsd_factor

if TYPE_CHECKING:
    from vlbert.training.hooks import TrainerHook
    from vlbert.training.training_config import TrainingConfig


@dataclass(frozen=True)
class Schedule:
    """One entry of :data:`SCHEDULES`.

    Attributes:
        factor: ``training config -> (step -> multiplier)``, the step an int from 0, the multiplier a float.
        check: ``training config -> None``; raises ValueError (one line) for settings the schedule cannot take.
        hooks: ``training config -> list of TrainerHook`` the trainer runs after its own (e.g. a checkpoint kept).
    """

    factor: Callable[[TrainingConfig], Callable[[int], float]]
    check: Callable[[TrainingConfig], None] = lambda config: None
    hooks: Callable[[TrainingConfig], list] = lambda config: []


def linear_schedule(warmup_steps: int, max_steps: int) -> Callable[[int], float]:
    """Learning-rate multiplier: linear warmup from 0 over ``warmup_steps``, then linear decay to 0."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        return max(0.0, (max_steps - step) / max(1, max_steps - warmup_steps))

    return factor


def _linear(config: TrainingConfig) -> Callable[[int], float]:
    return linear_schedule(config.warmup_steps, config.max_steps)


#: ``training.schedule`` -> its :class:`Schedule`
SCHEDULES: dict[str, Schedule] = {
    "linear": Schedule(_linear),
    "wsd": Schedule(wsd_factor, check_wsd, lambda config: [EndOfStableCheckpoint(decay_start(config))]),
}


def schedule_of(config: TrainingConfig) -> Schedule:
    """The :class:`Schedule` ``training.schedule`` names.

    Raises:
        ValueError: a name not in :data:`SCHEDULES` (one line listing them).
    """
    if config.schedule not in SCHEDULES:
        raise ValueError(f"training.schedule must be one of {sorted(SCHEDULES)}, got {config.schedule!r}")
    return SCHEDULES[config.schedule]


def build_scheduler(optimizer: torch.optim.Optimizer, config: TrainingConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` over ``optimizer`` with the multiplier of ``training.schedule``; it counts optimizer steps (not
    accelerate's prepared scheduler, which would advance once per process)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_of(config).factor(config))


def schedule_hooks(config: TrainingConfig) -> list[TrainerHook]:
    """The hooks ``training.schedule`` adds to the trainer (``wsd``: the end-of-stable checkpoint)."""
    return schedule_of(config).hooks(config)


__all__ = ["Schedule", "SCHEDULES", "linear_schedule", "schedule_of", "build_scheduler", "schedule_hooks"]
