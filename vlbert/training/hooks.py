"""What runs around the trainer's optimizer steps, as detectron2's hooks (``HookBase``): periodic evaluation and
checkpoints are hooks, and so is anything a user adds (a throughput meter, an EMA of the weights, a profiler)
without editing :meth:`vlbert.training.trainer.Trainer.train`.

A hook sees the trainer: ``trainer.step`` (optimizer steps done), ``trainer.stats`` (the last step's
:class:`StepStats`), ``trainer.config`` (the
:class:`~vlbert.training.trainer.TrainingConfig`), ``trainer.unwrapped`` (the model), ``trainer.evaluate()``,
``trainer.save_checkpoint()``, ``trainer.log(record, split)`` (a line of log.jsonl + TensorBoard) and
``trainer.last_eval`` (the latest held-out figures). Time spent in hooks is not counted as training time
(tokens/s, step_time_s). A hook with state (an EMA of the weights, a meter) returns it from ``state_dict`` and takes
it back in ``load_state_dict``: it is saved in every checkpoint, so a resumed run continues it exactly. Logging is a
hook too (:class:`~vlbert.training.log_hook.LogHook`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class StepStats:
    """What one optimizer step did, for hooks to read (``trainer.stats``); tensors stay on the device (reading
    them is a host synchronisation: do it at log steps only).

    Attributes: step (the step's number, from 1), epoch, tokens, sequences and regions (real text tokens,
    sequences and real regions, this process, counted on the host), seconds (wall time of the step on the host,
    data wait included), data_wait (seconds spent waiting for batches), loss (0-d float tensor, the global
    batch's), grad_norm (0-d, before clipping), lr (the rate the step used), sums (the step's loss and every
    objective's loss and metric, 0-d tensors).
    """

    step: int
    epoch: int = 0
    tokens: int = 0
    sequences: int = 0
    regions: int = 0
    seconds: float = 0.0
    data_wait: float = 0.0
    loss: torch.Tensor | None = None
    grad_norm: torch.Tensor | None = None
    lr: float = 0.0
    sums: dict = field(default_factory=dict)


class TrainerHook:
    """Base class: override what you need. Called on every process (guard writes with ``trainer.is_main``)."""

    def before_train(self, trainer) -> None:
        """Once, before the first step of this run (after a resume: at the resumed step)."""

    def before_step(self, trainer) -> None:
        """Before each optimizer step (``trainer.step`` counts the steps done so far)."""

    def after_step(self, trainer) -> None:
        """After each optimizer step (``trainer.step`` already counts it), a skipped non-finite step included
        (``training.on_nonfinite=skip``: its update is not applied, the learning-rate schedule still advances)."""

    def after_train(self, trainer, metrics: dict[str, Any]) -> None:
        """Once, after the last step and the final evaluation, before metrics.json and the final model are
        written: add figures to ``metrics`` here."""

    def state_dict(self) -> dict:
        """The hook's state, saved in every checkpoint (tensors and plain Python values). Default: none."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Take back what :meth:`state_dict` returned, when a run resumes from a checkpoint."""


class PeriodicEvaluation(TrainerHook):
    """``training.eval_every``: evaluate on the held-out batches every N steps (the last step is evaluated by the
    trainer itself) and log the figures as an ``eval`` line."""

    def after_step(self, trainer) -> None:
        every = trainer.config.eval_every
        if every and trainer.step % every == 0 and trainer.step < trainer.config.max_steps:
            trainer.last_eval = trainer.evaluate()
            trainer.log({"step": trainer.step, **trainer.last_eval}, "eval")


class PeriodicCheckpoint(TrainerHook):
    """``training.save_every``: write ``checkpoints/step-N`` every N steps (the final model is written by the
    trainer), after checking that no step so far was non-finite (``training.on_nonfinite``)."""

    def after_step(self, trainer) -> None:
        every = trainer.config.save_every
        if every and trainer.step % every == 0 and trainer.step < trainer.config.max_steps:
            trainer.check_nonfinite()
            trainer.save_checkpoint()


__all__ = ["StepStats", "TrainerHook", "PeriodicEvaluation", "PeriodicCheckpoint"]
