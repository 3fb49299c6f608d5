"""The warmup-stable-decay (trapezoidal) learning-rate schedule (``training.schedule: wsd``).

Definition, for the optimizer step ``s`` (from 0; the multiplier of ``training.learning_rate`` that step uses), with
``W`` = ``warmup_steps``, ``N`` = ``max_steps``, ``K`` decay steps (:func:`decay_steps`), ``D = N - K`` the first
step of the decay and ``a`` = ``final_lr_ratio``:

* warmup, ``s < W``: ``(s + 1) / W`` (linear, as the ``linear`` schedule's warmup);
* stable, ``W <= s < D``: ``1``;
* decay, ``s >= D``: ``a + (1 - a) x shape((s - D) / K)``, with ``shape(t) = 1 - t`` (``decay_shape: linear``) or
  ``1 - sqrt(t)`` (``decay_shape: 1-sqrt``).

Sources: AnswerDotAI/ModernBERT at commit 00220af2c7ae0da5e3778d2bbd4901c303d5fdbd: ``src/scheduler.py``
``WarmupStableDecayScheduler`` (a linear decay to ``alpha_f`` over the last ``t_decay``, default 0.1 of the run) and
``OneMinusSqrtScheduler`` (``alpha_f + (1 - alpha_f)(1 - sqrt(t))``); ``yamls/modernbert/modernbert-base-pretrain.yaml``
(``warmup_stable_decay``, ``t_warmup`` 3B tokens, ``t_decay`` 0: the decay is a separate run) and
``modernbert-base-learning-rate-decay.yaml`` (``one_minus_sqrt``, ``alpha_f`` 0.001, 50B tokens). The 1 - sqrt
shape is Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from vlbert.training.training_config import TrainingConfig

#: ``training.decay_shape`` -> the decay's multiplier at the fraction ``t`` in [0, 1) of the decay done
DECAY_SHAPES: dict[str, Callable[[float], float]] = {
    "linear": lambda t: 1.0 - t,
    "1-sqrt": lambda t: 1.0 - math.sqrt(t),
}


def decay_steps(config: TrainingConfig) -> int:
    """K, the steps of the decay: ``decay_steps`` where given, else ``round(decay_fraction x max_steps)``
    (``decay_fraction`` default 0.1: ModernBERT's ``t_decay`` default ``0.1dur``)."""
    if config.decay_steps is not None:
        return config.decay_steps
    fraction = 0.1 if config.decay_fraction is None else config.decay_fraction
    return round(fraction * config.max_steps)


def decay_start(config: TrainingConfig) -> int:
    """D = ``max_steps`` - K: the first step whose rate decays, and the number of steps done when the stable phase
    ends (the end-of-stable checkpoint's step)."""
    return config.max_steps - decay_steps(config)


def check_wsd(config: TrainingConfig) -> None:
    """Refuse WSD settings that contradict one another (one line each).

    Raises:
        ValueError: both ``decay_steps`` and ``decay_fraction`` given; warmup and decay longer than ``max_steps``;
            a ``decay_shape`` not in :data:`DECAY_SHAPES`.
    """
    if config.decay_steps is not None and config.decay_fraction is not None:
        raise ValueError(
            f"training.decay_steps={config.decay_steps} and training.decay_fraction={config.decay_fraction} both "
            "set the WSD decay's length; keep one"
        )
    if config.decay_shape not in DECAY_SHAPES:
        raise ValueError(f"training.decay_shape must be one of {sorted(DECAY_SHAPES)}, got {config.decay_shape!r}")
    if config.warmup_steps + decay_steps(config) > config.max_steps:
        raise ValueError(
            f"training.warmup_steps={config.warmup_steps} plus the WSD decay's {decay_steps(config)} steps exceed "
            f"max_steps={config.max_steps}; shorten the warmup or the decay (decay_steps / decay_fraction)"
        )


def wsd_schedule(
    warmup_steps: int, max_steps: int, decay: int, shape: str = "linear", final_ratio: float = 0.0
) -> Callable[[int], float]:
    """The learning-rate multiplier of step ``s`` (int, from 0) as the module docstring defines it: ``decay`` (K)
    steps of decay of ``shape`` (a key of :data:`DECAY_SHAPES`) to ``final_ratio`` at the end of ``max_steps``.
    Returns a float in [0, 1] (``final_ratio`` after ``max_steps``)."""
    start, shape_of = max_steps - decay, DECAY_SHAPES[shape]

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if step < start:
            return 1.0
        t = min(1.0, (step - start) / decay) if decay else 1.0
        return final_ratio + (1.0 - final_ratio) * shape_of(t)

    return factor


def wsd_factor(config: TrainingConfig) -> Callable[[int], float]:
    """:func:`wsd_schedule` from the ``training`` section (``warmup_steps``, ``max_steps``, :func:`decay_steps`,
    ``decay_shape``, ``final_lr_ratio``)."""
    return wsd_schedule(
        config.warmup_steps, config.max_steps, decay_steps(config), config.decay_shape, config.final_lr_ratio
    )


__all__ = ["DECAY_SHAPES", "decay_steps", "decay_start", "check_wsd", "wsd_schedule", "wsd_factor"]
