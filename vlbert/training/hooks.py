"""What runs around the trainer's optimizer steps, as detectron2's hooks (``HookBase``): periodic evaluation and
checkpoints are hooks, and so is anything a user adds (a throughput meter, an EMA of the weights, a profiler)
without editing :meth:`vlbert.training.trainer.Trainer.train`.

A hook sees the trainer: ``trainer.step`` (optimizer steps done), ``trainer.config`` (the
:class:`~vlbert.training.trainer.TrainingConfig`), ``trainer.unwrapped`` (the model), ``trainer.evaluate()``,
``trainer.save_checkpoint()``, ``trainer.log(record, split)`` (a line of log.jsonl + TensorBoard) and
``trainer.last_eval`` (the latest held-out figures). Time spent in hooks is not counted as training time
(tokens/s, step_time_s).
"""

from __future__ import annotations

from typing import Any


class TrainerHook:
    """Base class: override what you need. Called on every process (guard writes with ``trainer.is_main``)."""

    def before_train(self, trainer) -> None:
        """Once, before the first step of this run (after a resume: at the resumed step)."""

    def after_step(self, trainer) -> None:
        """After each optimizer step (``trainer.step`` already counts it), a skipped non-finite step included
        (``training.on_nonfinite=skip``: its update is not applied, the learning-rate schedule still advances)."""

    def after_train(self, trainer, metrics: dict[str, Any]) -> None:
        """Once, after the last step and the final evaluation, before metrics.json and the final model are
        written: add figures to ``metrics`` here."""


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


__all__ = ["TrainerHook", "PeriodicEvaluation", "PeriodicCheckpoint"]
