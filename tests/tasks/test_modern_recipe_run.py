"""Text pretraining with the 2024-26 encoder recipe as options (StableAdamW, warmup-stable-decay, MLM without NSP
at a scheduled masking rate): a run stopped in the decay and resumed gives the losses and rates of an uninterrupted
one, and the end-of-stable checkpoint is kept and resumable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vlbert.checkpoint import read_state_dict
from vlbert.models.bert import BertForPreTraining
from vlbert.recipes import RECIPES, run
from vlbert.training.checkpointing import STATE_NAME, latest_checkpoints
from vlbert.training.end_of_stable import END_OF_STABLE
from vlbert.training.trainer import Trainer
from vlbert.training.wsd import wsd_schedule

LR, MAX_STEPS, WARMUP, DECAY = 2e-3, 6, 1, 2  # the decay starts at step D = 4


def modern_config(corpus, output_dir) -> dict:
    return {
        "modality": "text",
        "tokenizer": "minilm",
        "model": {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 32,
        },
        "data": {
            "corpus": str(corpus),
            "max_seq_length": 32,
            "eval_fraction": 0.1,
            "objectives": {"mlm": 1},
            "mlm_probability": 0.3,
            "mlm_probability_schedule": {0: 0.3, 0.5: 0.15},
            "eval_mlm_probability": 0.15,
        },
        "training": {
            "output_dir": str(output_dir),
            "max_steps": MAX_STEPS,
            "batch_size": 4,
            "optimizer": "stable_adamw",
            "learning_rate": LR,
            "adam_beta2": 0.98,
            "weight_decay": 1e-5,
            "schedule": "wsd",
            "warmup_steps": WARMUP,
            "decay_steps": DECAY,
            "decay_shape": "1-sqrt",
            "log_every": 1,
            "save_every": 3,
            "save_total_limit": 1,
            "progress_bar": False,
        },
    }


class Crash(RuntimeError):
    pass


def train_log(path: Path) -> dict[int, dict]:
    lines = [json.loads(line) for line in (path / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in lines if r["split"] == "train"}


def test_a_wsd_stable_adamw_run_resumed_in_the_decay_equals_the_uninterrupted_one(small_corpus, tmp_path, monkeypatch):
    recipe = RECIPES["text-pretraining"]
    reference = tmp_path / "reference"
    run(recipe, modern_config(small_corpus, reference))
    expected = train_log(reference)
    factor = wsd_schedule(WARMUP, MAX_STEPS, DECAY, "1-sqrt")
    assert [expected[s]["lr"] for s in range(1, MAX_STEPS + 1)] == pytest.approx(
        [LR * factor(s) for s in range(MAX_STEPS)], rel=1e-12
    )

    crashed = tmp_path / "crashed"
    original_log = Trainer.log

    def crash_after_step_5(self, record, split):  # in the decay; the newest checkpoint is the hook's step-4
        original_log(self, record, split)
        if record.get("step") == 5 and split == "train":
            raise Crash("simulated crash")

    monkeypatch.setattr(Trainer, "log", crash_after_step_5)
    with pytest.raises(Crash):
        run(recipe, modern_config(small_corpus, crashed))
    monkeypatch.setattr(Trainer, "log", original_log)
    run(recipe, modern_config(small_corpus, crashed), resume=True)
    got = train_log(crashed)
    assert sorted(got) == sorted(expected) == list(range(1, MAX_STEPS + 1))
    assert [got[s]["lr"] for s in got] == [expected[s]["lr"] for s in expected]
    assert max(abs(got[s]["loss"] - expected[s]["loss"]) for s in expected) <= 1e-6

    # The end-of-stable checkpoint: written after step D = 4 (step-4 too, which the resumed run started from; step-3,
    # the periodic one, rotated away), kept whatever save_total_limit says.
    for out in (reference, crashed):
        assert [p.name for p in latest_checkpoints(out)] == ["step-4"]
        kept = out / "checkpoints" / END_OF_STABLE
        assert torch.load(kept / STATE_NAME, weights_only=True)["step"] == MAX_STEPS - DECAY
    a, b = (read_state_dict(out / "checkpoints" / END_OF_STABLE) for out in (reference, crashed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    final = read_state_dict(reference)
    assert any(not torch.equal(a[k], final[k]) for k in a)  # the decay's two steps moved the weights
    # A new run's --init-from: the weights load as a model (the crashed run resumed from the same files, step-4).
    model = BertForPreTraining.from_pretrained(reference / "checkpoints" / END_OF_STABLE)
    assert torch.equal(model.bert.embeddings.word_embeddings.weight, a["bert.embeddings.word_embeddings.weight"])
