"""Trainer hooks at detectron2's ``HookBase``: before/after each step with the step's statistics, and state saved
with every checkpoint, so that a hook with state (an EMA of the weights) continues exactly after a crash."""

from __future__ import annotations

import pytest
import torch
from helpers.builders import tiny_text_trainer

from vlbert.training.ema import EMAHook
from vlbert.training.hooks import TrainerHook


class Crash(RuntimeError):
    pass


class CrashAfter(TrainerHook):
    """Kills the run (as SIGKILL would: no checkpoint, no cleanup) after step ``step``."""

    def __init__(self, step):
        self.step = step

    def after_step(self, trainer):
        if trainer.step == self.step:
            raise Crash(f"killed after step {self.step}")


class Recorder(TrainerHook):
    def __init__(self):
        self.calls = []

    def before_step(self, trainer):
        self.calls.append(("before", trainer.step))

    def after_step(self, trainer):
        s = trainer.stats
        self.calls.append(
            (
                "after",
                trainer.step,
                s.step,
                s.tokens > 0,
                s.seconds >= s.data_wait >= 0,
                bool(torch.isfinite(s.loss)),
                s.lr > 0,
            )
        )


def trainer(tmp_path, corpus, tokenizer, hooks, max_steps=6, save_every=3):
    return tiny_text_trainer(
        tmp_path,
        corpus,
        tokenizer,
        max_length=32,
        hooks=hooks,
        model=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64),
        max_steps=max_steps,
        batch_size=4,
        warmup_steps=1,
        learning_rate=1e-3,
        log_every=2,
        save_every=save_every,
    )


def test_hooks_see_each_step_and_its_statistics(tmp_path, small_token_corpus, tokenizer):
    recorder = Recorder()
    trainer(tmp_path, small_token_corpus, tokenizer, [recorder], max_steps=3, save_every=0).train()
    assert recorder.calls == [c for s in range(3) for c in (("before", s), ("after", s + 1, s + 1) + (True,) * 4)]


def test_an_ema_hook_resumed_after_a_kill_equals_the_uninterrupted_run(tmp_path, small_token_corpus, tokenizer):
    """Killed after step 5 (checkpoint at 3), resumed: the EMA's shadow weights after step 6 equal those of a run
    never interrupted (the hook's state travels in training_state.pt), and differ from the weights."""
    whole = EMAHook(0.9)
    trainer(tmp_path / "whole", small_token_corpus, tokenizer, [whole]).train()

    killed = tmp_path / "killed"
    with pytest.raises(Crash):
        trainer(killed, small_token_corpus, tokenizer, [EMAHook(0.9), CrashAfter(5)]).train()
    resumed_ema = EMAHook(0.9)
    resumed = trainer(killed, small_token_corpus, tokenizer, [resumed_ema])
    assert resumed.resume() and resumed.step == 3 and resumed_ema.updates == 3
    resumed.train()
    assert resumed_ema.updates == whole.updates == 6
    for a, b in zip(resumed_ema.shadow, whole.shadow, strict=True):
        assert torch.equal(a, b)
    weights = [p.detach() for p in resumed.unwrapped.parameters()]
    assert any(not torch.equal(s, w) for s, w in zip(resumed_ema.shadow, weights, strict=True))
    with pytest.raises(ValueError, match=r"EMA decay must be in \[0, 1\)"):
        EMAHook(1.0)
