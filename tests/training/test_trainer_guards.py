"""Trainer guards: a non-finite loss stops (naming the step and batch) without touching the last good
checkpoint, or is skipped by configuration; atomic checkpoint directories."""

from __future__ import annotations

import json
import math

import pytest
import torch

from vlbert.checkpoint import read_state_dict, write_safetensors
from vlbert.models.outputs import ObjectiveOutput
from vlbert.training.trainer import NonFiniteLossError, Trainer, TrainingConfig


class Toy(torch.nn.Module):
    """y = w x: an MSE objective with the save/load interface the trainer uses."""

    objectives = ("mse",)

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, y):
        loss = torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)
        out = ObjectiveOutput()
        out.add("mse", loss, "mse_value", loss.detach(), len(y))
        return out

    def save_pretrained(self, directory, tokenizer=None):
        directory.mkdir(parents=True, exist_ok=True)
        write_safetensors(self.state_dict(), directory / "model.safetensors")

    def load_converted_state_dict(self, state, source="", strict=False):
        self.load_state_dict(state)


def batches_with_nan_at(bad_batch: int):
    def factory(epoch, start, rank, world):
        g = torch.Generator().manual_seed(epoch)
        out = []
        for i in range(10):
            x = torch.randn(8, 4, generator=g)
            if epoch == 0 and i == bad_batch:
                x[0, 0] = float("nan")
            out.append({"x": x, "y": x.sum(-1)})
        return out[start:]

    return factory


def config(tmp_path, **kw):
    values = dict(
        output_dir=str(tmp_path),
        max_steps=6,
        batch_size=8,
        learning_rate=0.05,
        warmup_steps=0,
        log_every=1,
        save_every=2,
        progress_bar=False,
    )
    return TrainingConfig(**{**values, **kw})


def test_nonfinite_loss_stops_and_keeps_the_checkpoint(tmp_path):
    trainer = Trainer(Toy(), config(tmp_path), batches_with_nan_at(2))
    with pytest.raises(NonFiniteLossError, match=r"step 3 \(epoch 0, batch 2\)"):
        trainer.train()
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert checkpoints == ["step-2"], "no later checkpoint, no temporary directory left behind"
    state = read_state_dict(tmp_path / "checkpoints" / "step-2")
    assert all(torch.isfinite(t).all() for t in state.values())
    resumed = Trainer(Toy(), config(tmp_path), batches_with_nan_at(-1))
    assert resumed.resume() and resumed.step == 2


def test_nonfinite_loss_can_be_skipped(tmp_path):
    trainer = Trainer(Toy(), config(tmp_path, on_nonfinite="skip"), batches_with_nan_at(2))
    metrics = trainer.train()
    assert metrics["skipped_steps"] == 1 and metrics["step"] == 6
    assert all(torch.isfinite(p).all() for p in trainer.unwrapped.parameters())
    assert math.isfinite(metrics["train_loss"])


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    trainer = Trainer(Toy(), config(tmp_path), batches_with_nan_at(-1))
    trainer.step = 2
    trainer.save_checkpoint()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    trainer.step = 4
    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        trainer.save_checkpoint()
    from vlbert.training.checkpointing import latest_checkpoints

    assert [p.name for p in latest_checkpoints(tmp_path)] == ["step-2"], "a half-written step-4 is never complete"


def test_fp16_is_refused():
    with pytest.raises(
        ValueError, match="training.mixed_precision must be one of 'auto', 'no', 'bf16', 'bf16-params', got 'fp16'"
    ):
        TrainingConfig(mixed_precision="fp16").validate()


def test_resume_restores_the_numpy_generator(tmp_path):
    import numpy as np

    trainer = Trainer(Toy(), config(tmp_path), batches_with_nan_at(-1))
    np.random.seed(5)
    trainer.save_checkpoint()
    expected = np.random.rand(3)
    np.random.seed(99)
    assert Trainer(Toy(), config(tmp_path), batches_with_nan_at(-1)).resume()
    np.testing.assert_array_equal(np.random.rand(3), expected)


class TwoHeads(Toy):
    """Trains ``linear``; ``idle`` enters the loss with weight zero and is reported idle (as VL heads of the
    objectives a step does not train)."""

    def __init__(self):
        super().__init__()
        self.idle = torch.nn.Linear(4, 1)

    def forward(self, x, y):
        out = super().forward(x, y)
        out.loss = out.loss + sum(p.sum() for p in self.idle.parameters()) * 0.0
        out.unused_parameters = list(self.idle.parameters())
        return out


def test_idle_heads_are_not_updated(tmp_path):
    """Their zero gradients are dropped, so AdamW skips them: no weight decay, no momentum step."""
    model = TwoHeads()
    idle_before = model.idle.weight.detach().cpu().clone()
    trained_before = model.linear.weight.detach().cpu().clone()
    trainer = Trainer(model, config(tmp_path, weight_decay=0.1), batches_with_nan_at(-1))
    trainer.train()
    assert torch.equal(model.idle.weight.detach().cpu(), idle_before)  # compared on one device (CPU)
    assert not torch.equal(model.linear.weight.detach().cpu(), trained_before), "the used head must have trained"


@pytest.mark.parametrize("device_skip", [True, False])
def test_a_skipped_step_is_a_step_on_both_paths(tmp_path, device_skip):
    """The fused optimizer skips a non-finite step on the device, other optimizers on the host: either way the
    weights stay, the schedule advances, the step is logged and the hooks run (the host path used to do none)."""
    from vlbert.training.hooks import TrainerHook

    class Count(TrainerHook):
        steps: list = []

        def after_step(self, trainer):
            self.steps.append((trainer.step, trainer.scheduler.get_last_lr()[0]))

    hook = Count()
    hook.steps = []
    trainer = Trainer(
        Toy(), config(tmp_path, on_nonfinite="skip", warmup_steps=3, save_every=0), batches_with_nan_at(2), hooks=[hook]
    )
    trainer._device_skip = device_skip
    metrics = trainer.train()
    reference = Trainer(Toy(), config(tmp_path / "ref", warmup_steps=3, save_every=0), batches_with_nan_at(-1))
    reference.train()
    assert metrics["skipped_steps"] == 1
    assert [s for s, _ in hook.steps] == [1, 2, 3, 4, 5, 6]

    # the same learning rate at every step as a run without the bad batch
    def lrs(directory):
        return {
            r["step"]: r["lr"]
            for r in map(json.loads, (directory / "log.jsonl").read_text().splitlines())
            if r["split"] == "train"
        }

    assert lrs(tmp_path) == lrs(tmp_path / "ref") and sorted(lrs(tmp_path)) == [1, 2, 3, 4, 5, 6]
