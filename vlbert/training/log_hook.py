"""Logging as a trainer hook: one ``log.jsonl`` line (and TensorBoard scalars) every ``log_every`` steps, built
from the steps' :class:`~vlbert.training.hooks.StepStats`, and the progress bar."""

from __future__ import annotations

import json
import logging

from vlbert.training.hooks import StepStats, TrainerHook

logger = logging.getLogger(__name__)


class _Window:
    """The steps since the last log line: their time (hooks excluded), data wait, steps, tokens, sequences and
    regions."""

    def __init__(self):
        self.seconds = self.data_wait = 0.0
        self.steps = self.tokens = self.sequences = self.regions = 0

    def add(self, stats: StepStats) -> None:
        self.seconds += stats.seconds
        self.data_wait += stats.data_wait
        self.steps += 1
        self.tokens += stats.tokens
        self.sequences += stats.sequences
        self.regions += stats.regions


class LogHook(TrainerHook):
    """Writes a ``train`` line every ``training.log_every`` steps and at the last: the step's loss, each
    objective's loss and metric, lr, gradient norm, tokens/s over the window (all ranks), step time, the fraction
    of it spent waiting for data, and MFU (:meth:`~vlbert.training.trainer.Trainer.mfu`). Non-finite steps are
    read (and, with ``on_nonfinite: stop``, raised) at these lines: the only host synchronisation of the loop.
    :meth:`write` is how everything else logs (``Trainer.log``)."""

    def __init__(self):
        self.file = self.writer = self.bar = None
        self.window = _Window()

    def before_train(self, trainer) -> None:
        self.window = _Window()
        if not trainer.is_main:
            return
        self.writer = _tensorboard(trainer.output_dir)
        self.file = open(trainer.output_dir / "log.jsonl", "a", encoding="utf-8")  # noqa: SIM115 (close() closes it)
        if trainer.config.progress_bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=trainer.config.max_steps, initial=trainer.step, desc="train", unit="step", dynamic_ncols=True
            )

    def after_step(self, trainer) -> None:
        stats, cfg = trainer.stats, trainer.config
        self.window.add(stats)
        if self.bar is not None:
            self.bar.update(1)
        if not (cfg.log_every and trainer.step % cfg.log_every == 0 or trainer.step == cfg.max_steps):
            return
        trainer.check_nonfinite()
        window, self.window = self.window, _Window()
        elapsed = max(window.seconds, 1e-9)
        tokens = trainer._global_sum(window.tokens)
        record = {
            "step": trainer.step,
            "epoch": stats.epoch,
            **{k: float(v) for k, v in stats.sums.items()},
            "lr": stats.lr,
            "grad_norm": float(stats.grad_norm),
            "tokens_per_s": tokens / elapsed,
            "step_time_s": elapsed / max(1, window.steps),
            "data_wait_fraction": min(1.0, window.data_wait / elapsed),
        }
        mfu = trainer.mfu(tokens, trainer._global_sum(window.sequences), elapsed, trainer._global_sum(window.regions))
        if mfu is not None:
            record["mfu"] = mfu
        trainer.log(record, "train")  # (Trainer.log: the one way lines are written, which writes through write)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")

    def write(self, record: dict, split: str) -> None:
        """Append ``record`` (with ``step``) as a ``split`` line of log.jsonl and to TensorBoard (main process)."""
        if self.file is None:
            return
        record = {"split": split, **record}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if split == "eval":  # the held-out figures as they happen, not only in log.jsonl
            self._say(eval_line(record))
        if self.writer is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.writer.add_scalar(f"{split}/{k}", v, record["step"])

    def _say(self, line: str) -> None:
        """One line for the person watching: above the progress bar where there is one, else the log."""
        if self.bar is not None:
            self.bar.write(line)
        else:
            logger.info(line)

    def stop(self) -> None:
        """The loop ended (finished, preempted or failed): close the bar, flush the log."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:
        """After the final lines: close log.jsonl and TensorBoard."""
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def eval_line(record: dict) -> str:
    """``"held-out at step 200: mlm_accuracy 0.3120, nsp_accuracy 0.5040, loss 4.1033"``: a held-out ``eval``
    record's metrics (``eval_`` dropped), then its losses, 4 decimals; their sampling figures (``<key>_stderr``,
    ``<key>_n``) are left to the log file."""
    values = {
        k.removeprefix("eval_"): v
        for k, v in record.items()
        if k not in ("split", "step")
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and not (k.endswith(("_stderr", "_n")) and k.rsplit("_", 1)[0] in record)
    }
    ordered = sorted(values, key=lambda k: (k.endswith("loss"), k))
    return f"held-out at step {record.get('step')}: " + ", ".join(f"{k} {values[k]:.4f}" for k in ordered)


def _tensorboard(output_dir):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is a declared dependency; keep training if it was removed
        logger.warning("tensorboard is not installed (pip install tensorboard); TensorBoard logs are off")
        return None
    return SummaryWriter(str(output_dir / "tensorboard"))


__all__ = ["LogHook", "eval_line"]
