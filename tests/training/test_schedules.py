"""The learning-rate schedules of ``training.schedule``: warmup-stable-decay equals its written definition at every
step (vlbert/training/wsd.py's docstring, after ModernBERT's ``WarmupStableDecayScheduler`` and
``OneMinusSqrtScheduler``), the linear default is unchanged, and contradictory settings are refused in one line."""

from __future__ import annotations

import math

import pytest
import torch

from vlbert.training.schedules import SCHEDULES, build_scheduler, linear_schedule, schedule_hooks
from vlbert.training.training_config import TrainingConfig
from vlbert.training.wsd import decay_start, decay_steps


def written_wsd(step: int, warmup: int, total: int, decay: int, shape: str, final: float) -> float:
    """The definition, computed afresh: linear warmup (step + 1) / W, 1 until D = N - K, then from 1 down to the
    final ratio along 1 - t or 1 - sqrt(t), t = (step - D) / K."""
    if step < warmup:
        return (step + 1) / warmup
    start = total - decay
    if step < start:
        return 1.0
    t = (step - start) / decay
    return final + (1 - final) * ((1 - t) if shape == "linear" else (1 - math.sqrt(t)))


CASES = [
    dict(warmup_steps=10, max_steps=100, decay_steps=20, decay_shape="linear", final_lr_ratio=0.0),
    dict(warmup_steps=7, max_steps=93, decay_fraction=0.25, decay_shape="1-sqrt", final_lr_ratio=0.001),
    dict(warmup_steps=0, max_steps=50, decay_shape="linear", final_lr_ratio=0.1),  # neither: 0.1 of the steps
    dict(warmup_steps=5, max_steps=40, decay_steps=35, decay_shape="1-sqrt", final_lr_ratio=0.0),  # no stable phase
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['decay_shape']}-{c['max_steps']}")
def test_wsd_equals_its_definition_at_every_step(case):
    config = TrainingConfig(schedule="wsd", learning_rate=8e-4, **case)
    k = decay_steps(config)
    assert k == case.get("decay_steps", round(case.get("decay_fraction", 0.1) * case["max_steps"]))
    assert decay_start(config) == case["max_steps"] - k
    # Through the optimizer and LambdaLR the trainer builds: the rate each step uses is lr x the definition.
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=config.learning_rate)
    scheduler = build_scheduler(optimizer, config)
    for step in range(config.max_steps):
        expected = config.learning_rate * written_wsd(
            step, case["warmup_steps"], case["max_steps"], k, case["decay_shape"], case["final_lr_ratio"]
        )
        assert scheduler.get_last_lr()[0] == pytest.approx(expected, rel=1e-12, abs=1e-15), step
        optimizer.step()
        scheduler.step()


def test_wsd_phases_hold_at_their_boundaries():
    config = TrainingConfig(schedule="wsd", warmup_steps=4, max_steps=20, decay_steps=8, decay_shape="1-sqrt")
    factor = SCHEDULES["wsd"].factor(config)
    assert [factor(s) for s in (0, 3)] == [0.25, 1.0]
    assert all(factor(s) == 1.0 for s in range(4, 13))  # stable through D - 1 = 11, and D itself (t = 0)
    assert factor(13) == pytest.approx(1 - math.sqrt(1 / 8)) and factor(19) == pytest.approx(1 - math.sqrt(7 / 8))
    assert [type(h).__name__ for h in schedule_hooks(config)] == ["EndOfStableCheckpoint"]
    assert schedule_hooks(config)[0].step == 12


def test_linear_default_is_bert_warmup_then_linear_decay():
    config = TrainingConfig(warmup_steps=10, max_steps=100)
    assert config.schedule == "linear" and schedule_hooks(config) == []
    factor, reference = SCHEDULES["linear"].factor(config), linear_schedule(10, 100)
    assert [factor(s) for s in range(101)] == [reference(s) for s in range(101)]


@pytest.mark.parametrize(
    "values, message",
    [
        ({"schedule": "cosine"}, r"training.schedule must be one of \['linear', 'wsd'\], got 'cosine'"),
        ({"optimizer": "lion"}, r"training.optimizer must be one of \['adamw', 'stable_adamw'\], got 'lion'"),
        ({"schedule": "wsd", "decay_steps": 5, "decay_fraction": 0.1}, "both set the WSD decay's length; keep one"),
        ({"schedule": "wsd", "warmup_steps": 60, "max_steps": 100, "decay_steps": 50}, "exceed max_steps=100"),
        ({"schedule": "wsd", "decay_shape": "cosine"}, r"decay_shape must be one of \['1-sqrt', 'linear'\]"),
        ({"decay_fraction": 1.5}, r"training.decay_fraction must be null or a float in \[0, 1\], got 1.5"),
    ],
)
def test_bad_recipe_settings_are_refused_in_one_line(values, message):
    with pytest.raises(ValueError, match=message) as raised:
        TrainingConfig.from_dict(values)
    assert "\n" not in str(raised.value)
