"""``python -m benchmarks memory`` (benchmarks/memory.py, benchmarks/memory_trace.py): the peak GPU memory of a
bf16-params training step, traced on a fake GPU, and the largest batch that fits. A two-layer model of width 64
keeps each trace to about a second."""

from __future__ import annotations

import pytest

from benchmarks import main as benchmarks_main
from benchmarks import memory
from benchmarks.memory_trace import BLOCK, StepMemory
from vlbert import BertConfig
from vlbert.commands import run_tool

RUN = {"data": {"max_seq_length": 32}}
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def traces() -> dict:
    """(gradient checkpointing, batch size) -> the traced step."""
    out = {}
    for checkpointing, batch in ((False, 4), (False, 8), (False, 12), (True, 8)):
        out[checkpointing, batch] = memory.trace(BertConfig(**TINY, gradient_checkpointing=checkpointing), RUN, batch)
    return out


def _blocks(nbytes: int) -> int:
    return -(-nbytes // BLOCK) * BLOCK


def test_parameters_gradients_and_optimizer_state_are_the_analytic_count(traces):
    """Per parameter: bf16 weight 2 B + float32 master 4 B + float32 gradient 4 B + AdamW's two moments 8 B, each
    tensor rounded up to the allocator's 512-byte block, plus fused AdamW's float32 step counter per tensor."""
    from vlbert import BertForPreTraining

    sizes = [p.numel() for p in BertForPreTraining(BertConfig(**TINY)).parameters()]
    step = traces[False, 8]
    assert step.num_parameters == sum(sizes)
    assert step.parameters == sum(_blocks(2 * n) + _blocks(4 * n) for n in sizes)
    assert step.optimizer == sum(2 * _blocks(4 * n) + BLOCK for n in sizes)
    assert step.static == sum(_blocks(2 * n) + 4 * _blocks(4 * n) + BLOCK for n in sizes)
    assert step.parameters + step.gradients + step.optimizer + step.activations == step.peak
    # the same model at another batch: the same static part
    assert traces[False, 4].static == traces[True, 8].static == step.static


def test_activations_grow_linearly_with_the_batch(traces):
    """The line through batches 4 and 8 predicts the peak at 12 within 10% of what the batch adds to it (the peak
    over the static part); the activations grow with the batch."""
    small, large, third = traces[False, 4], traces[False, 8], traces[False, 12]
    assert small.activations < large.activations < third.activations
    predicted = large.peak + (large.peak - small.peak)  # 12 - 8 = 8 - 4
    assert abs(predicted - third.peak) < 0.1 * (third.peak - third.static)


def test_gradient_checkpointing_lowers_the_activations(traces):
    """``model.gradient_checkpointing``: each layer's inner activations are recomputed in the backward."""
    assert traces[True, 8].activations < 0.8 * traces[False, 8].activations
    assert traces[True, 8].peak < traces[False, 8].peak


def test_the_largest_batch_is_on_the_line_through_two_traces():
    """fixed + per sequence x B <= 90% of the GPU's GiB; with 8-way sharding the static part at the peak / 8."""
    gib = 2**30
    small = StepMemory(10, 0, gib, 0, 2 * gib, gib, 5 * gib, 4 * gib)  # 1 GiB of activations per 10 sequences
    large = StepMemory(20, 0, gib, 0, 2 * gib, 2 * gib, 6 * gib, 4 * gib)
    fits = memory.largest_batches(small, large)
    assert fits == {24: int((24 * 0.9 - 4) * 10), 40: int((40 * 0.9 - 4) * 10), 80: 680, 141: int((141 * 0.9 - 4) * 10)}
    assert memory.largest_batches(small, large, gpus=(3,)) == {3: 0}
    assert memory.largest_batches(small, large, gpus=(80,), shards=8)[80] == int((72 - 4 + 3 * 7 / 8) * 10)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--config", "no-such-config"], "config file no-such-config does not exist"),
        (["--config", "text/bert-base-128", "--batch-size", "0"], "--batch-size must be at least 1"),
        (["--config", "text/bert-base-128", "--set", "model.hiden_size=8"], "unknown model config key"),
        (["--config", "finetune/uniter-base-vqa-v2"], "fine-tuning recipe"),
    ],
)
def test_bad_input_is_one_line(capsys, argv, says):
    """Through the command's error rule: one ``error:`` line, status 2, no traceback, before any trace."""
    assert run_tool(benchmarks_main, ["memory", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("error: ") and says in err, err


def test_the_line_is_taken_where_the_activations_make_the_peak(monkeypatch):
    """A peak that is the end of the backward's (4 GiB) up to 64 sequences and then grows 0.1 GiB a sequence, less
    steeply below 200: the traces move past the flat part and then to the 24 GB GPU's limit, on the steepest line."""
    gib = 2**30

    def fake_trace(config, run, batch):
        peak = max(4 * gib, 0.05 * gib * batch + 0.8 * gib, 0.1 * gib * batch - 9.2 * gib)
        return StepMemory(batch, 0, 0, 0, 0, int(peak - 3 * gib), int(peak), 3 * gib)

    monkeypatch.setattr(memory, "trace", fake_trace)
    small, large = memory.line_traces(None, None, fake_trace(None, None, 8))
    assert (small.batch_size, large.batch_size) == (
        208,
        416,
    )  # 8, 16, 32 flat; 64 -> 128 at 0.05; then 416 = its 24 GB batch
    assert memory.largest_batches(small, large, gpus=(24,)) == {24: int((24 * 0.9 + 9.2) / 0.1)}
