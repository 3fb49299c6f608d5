"""The end-of-stable checkpoint of a warmup-stable-decay run: ``checkpoints/end-of-stable``, kept whatever
``save_total_limit`` says.

Its weights have seen the warmup and the whole stable phase and none of the decay, so another decay (longer, on
other data, at another length) can start from it: ModernBERT runs its pretraining with no decay and starts the
context extension and the decay from that run's last checkpoint (AnswerDotAI/ModernBERT at commit
00220af2c7ae0da5e3778d2bbd4901c303d5fdbd, ``yamls/modernbert/modernbert-base-pretrain.yaml``: ``t_decay: 0tok``;
``modernbert-base-context-extension.yaml``: ``load_path`` the pretraining's checkpoint); Hägele et al. 2024 (section
3) branch their cooldowns from the stable phase's checkpoints.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from vlbert.run_files import CHECKPOINTS_DIR
from vlbert.training.hooks import TrainerHook

END_OF_STABLE = "end-of-stable"


def _link_or_copy(source: str, destination: str) -> None:
    """A hard link where the file system makes one (no second copy on disk), else a copy."""
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


class EndOfStableCheckpoint(TrainerHook):
    """After ``step`` optimizer steps (the last step before the decay: :func:`~vlbert.training.wsd.decay_start`),
    write a checkpoint as :class:`~vlbert.training.hooks.PeriodicCheckpoint` does (``checkpoints/step-N``: model,
    tokenizer, config.yaml, training state; a run resumes from it) and keep its files as
    ``checkpoints/end-of-stable`` (hard links, else copies; written under a temporary name and renamed), which the
    rotation of ``step-N`` checkpoints never removes. Where ``training.save_every`` has just written ``step-N`` the
    hook reuses it. Runs after the periodic checkpoint; holds no state. A run resumed after that step does not
    write it again."""

    def __init__(self, step: int):
        self.step = step

    def after_step(self, trainer) -> None:
        if trainer.step != self.step:
            return
        cfg = trainer.config
        periodic = cfg.save_every and self.step % cfg.save_every == 0 and self.step < cfg.max_steps
        root = Path(cfg.output_dir) / CHECKPOINTS_DIR
        if periodic:
            written = root / f"step-{self.step}" if trainer.is_main else None
        else:
            trainer.check_nonfinite()
            written = trainer.save_checkpoint()
        if written is None:  # not the main process
            return
        final, tmp = root / END_OF_STABLE, root / f".tmp-{END_OF_STABLE}"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(written, tmp, copy_function=_link_or_copy)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)


__all__ = ["END_OF_STABLE", "EndOfStableCheckpoint"]
