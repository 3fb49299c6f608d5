"""The trainer keeps the device fed: no host synchronisation of its own between log steps (counted by catching
every tensor-to-Python-scalar read), an input-bound run shows it in ``data_wait_fraction``, and the loader workers
default to none on CPU and some on a GPU machine."""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path

import torch
from helpers.builders import tiny_text_trainer
from torch.utils._python_dispatch import TorchDispatchMode

from vlbert.training.trainer import Trainer, TrainingConfig

ROOT = Path(__file__).resolve().parents[2]
OWN = (str(ROOT / "vlbert"), str(ROOT / "detectors"))


class ScalarReads(TorchDispatchMode):
    """Records every read of a tensor value into Python (``.item()``, ``float()``, ``int()``, ``bool()``: all
    dispatch ``aten._local_scalar_dense``, a host synchronisation on a GPU) with the vlbert file that asked and
    the trainer's step at the time."""

    def __init__(self, trainer):
        super().__init__()
        self.trainer, self.reads = trainer, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            stack = traceback.extract_stack()[:-1]
            ours = [k for k, f in enumerate(stack) if f.filename.startswith(OWN)]
            # Reads inside torch's DataLoader (its CPU seed generator) are the loader's host work, not the step's.
            loader = ours and any("torch/utils/data" in f.filename for f in stack[ours[-1] :])
            if ours and not loader:
                frame = stack[ours[-1]]
                self.reads.append((self.trainer.step, Path(frame.filename).name, frame.lineno))
        return func(*args, **(kwargs or {}))


def tiny_text_run(tmp_path, small_token_corpus, tokenizer, **training):
    return tiny_text_trainer(
        tmp_path,
        small_token_corpus,
        tokenizer,
        max_length=64,
        unpadded=False,
        model=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64),
        **{"max_steps": 6, "batch_size": 8, "warmup_steps": 1, "log_every": 0, **training},
    )


def test_no_host_synchronisation_between_log_steps(tmp_path, small_token_corpus, tokenizer):
    trainer = tiny_text_run(tmp_path, small_token_corpus, tokenizer, max_steps=6, on_nonfinite="stop")
    with ScalarReads(trainer) as mode:
        trainer.train()
    # log_every 0: the only log step is the last (6); steps 1..5 run while trainer.step is 0..4.
    in_steps = [r for r in mode.reads if r[0] < 5 and r[1] == "trainer.py"]
    assert in_steps == [], in_steps
    assert any(r[1] == "trainer.py" and r[0] >= 5 for r in mode.reads), "the check itself must see the log step"


def test_an_input_bound_run_shows_its_data_wait(tmp_path):
    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def save_pretrained(self, directory, tokenizer=None):
            directory.mkdir(parents=True, exist_ok=True)

        def forward(self, x, y):  # attention_mask stays on the host: counted, not passed
            from vlbert.models.outputs import ObjectiveOutput

            loss = torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)
            out = ObjectiveOutput()
            out.add("mse", loss, "mse_value", loss.detach(), len(y))
            return out

    def slow(epoch, start, rank, world):
        for _ in range(start, 100):
            time.sleep(0.1)  # a loader far slower than this model's step (a few ms, more on a busy machine)
            x = torch.randn(8, 4)
            yield {"x": x, "y": x.sum(-1), "attention_mask": torch.ones(8, 5, dtype=torch.long)}

    config = TrainingConfig(
        output_dir=str(tmp_path), max_steps=10, batch_size=8, warmup_steps=0, log_every=5, progress_bar=False
    )
    Trainer(Linear(), config, slow).train()
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [5, 10]
    for r in train:
        assert r["data_wait_fraction"] > 0.7, r  # nearly all of the 100 ms per step is the loader's
        assert 0.09 < r["step_time_s"] < 0.5, r
        assert abs(r["tokens_per_s"] - 40 / r["step_time_s"]) < 1e-6 * r["tokens_per_s"] + 1e-3, r  # 8 x 5 tokens


def test_loader_workers_default_to_none_on_cpu_and_some_on_gpu(monkeypatch):
    config = TrainingConfig()
    assert config.num_workers == -1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert config.loader_options()["num_workers"] == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert config.loader_options()["num_workers"] == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # 2 CPUs per process: one loader worker each
    assert config.loader_options()["num_workers"] == 1
    assert TrainingConfig(num_workers=2).loader_options()["num_workers"] == 2


def test_a_hook_meters_the_run_without_editing_train(tmp_path, small_token_corpus, tokenizer):
    """A throughput meter as a hook: called around every optimizer step, its figure lands in metrics.json, and
    the built-in periodic evaluation (a hook too) still logs at eval_every."""
    from vlbert.training.hooks import TrainerHook

    class StepMeter(TrainerHook):
        def __init__(self):
            self.steps, self.started = [], None

        def before_train(self, trainer):
            self.started = trainer.step

        def after_step(self, trainer):
            self.steps.append(trainer.step)

        def after_train(self, trainer, metrics):
            metrics["meter_steps"] = len(self.steps)

    trainer = tiny_text_run(tmp_path, small_token_corpus, tokenizer, max_steps=4, eval_every=2)
    meter = StepMeter()
    trainer.hooks.append(meter)
    trainer.eval_batches = lambda rank=0, world_size=1: trainer.train_batches(0, 0, rank, world_size)
    metrics = trainer.train()
    assert meter.started == 0 and meter.steps == [1, 2, 3, 4] and metrics["meter_steps"] == 4
    assert json.loads((tmp_path / "metrics.json").read_text())["meter_steps"] == 4
    evals = [
        r["step"] for r in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines()) if r["split"] == "eval"
    ]
    assert evals == [2, 4]  # the hook at step 2, the trainer's final evaluation at 4
