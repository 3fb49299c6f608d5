"""The end-of-stable hook of ``training.schedule: wsd``: after step D it keeps that step's checkpoint as
``checkpoints/end-of-stable``, writing it itself or reusing the one ``save_every`` has just written (a run with
training is in tests/tasks/test_modern_recipe_run.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from vlbert.training.end_of_stable import END_OF_STABLE, EndOfStableCheckpoint
from vlbert.training.training_config import TrainingConfig


class StubTrainer(SimpleNamespace):
    """What the hook reads of a trainer; save_checkpoint writes checkpoints/step-N with one file."""

    def save_checkpoint(self):
        self.saved.append(self.step)
        path = Path(self.config.output_dir) / "checkpoints" / f"step-{self.step}"
        path.mkdir(parents=True)
        (path / "training_state.pt").write_text(f"written by save_checkpoint at {self.step}")
        return path

    def check_nonfinite(self):
        self.checked.append(self.step)


def stub(tmp_path, save_every: int, is_main: bool = True) -> StubTrainer:
    config = TrainingConfig(
        output_dir=str(tmp_path), max_steps=10, warmup_steps=2, schedule="wsd", decay_steps=4, save_every=save_every
    )
    return StubTrainer(config=config, step=0, is_main=is_main, saved=[], checked=[])


@pytest.mark.parametrize("save_every", [0, 4])
def test_the_checkpoint_of_step_d_is_kept_as_end_of_stable(tmp_path, save_every):
    trainer, hook = stub(tmp_path, save_every), EndOfStableCheckpoint(6)
    for step in range(1, 11):
        trainer.step = step
        if save_every and step % save_every == 0:  # PeriodicCheckpoint, which runs before the hook
            trainer.save_checkpoint()
        hook.after_step(trainer)
    kept = tmp_path / "checkpoints" / END_OF_STABLE / "training_state.pt"
    assert kept.read_text() == "written by save_checkpoint at 6"
    if save_every:  # step 6 is no periodic step: the hook wrote it
        assert trainer.saved == [4, 6, 8] and trainer.checked == [6]
    else:
        assert trainer.saved == [6] and trainer.checked == [6]


def test_a_periodic_checkpoint_at_step_d_is_reused_not_written_again(tmp_path):
    trainer, hook = stub(tmp_path, save_every=3), EndOfStableCheckpoint(6)
    trainer.step = 6
    trainer.save_checkpoint()
    hook.after_step(trainer)
    assert trainer.saved == [6]
    assert (tmp_path / "checkpoints" / END_OF_STABLE / "training_state.pt").is_file()
    other = stub(tmp_path / "rank1", save_every=0, is_main=False)
    other.save_checkpoint = lambda: other.saved.append(6)  # every rank takes part; only the main one writes
    other.step = 6
    hook.after_step(other)
    assert other.saved == [6] and not (tmp_path / "rank1" / "checkpoints" / END_OF_STABLE).exists()
