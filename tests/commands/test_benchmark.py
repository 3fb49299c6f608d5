"""The benchmark's model-FLOPs estimate (the numerator of every MFU it prints) against PyTorch's own count of
the matmul FLOPs of a real forward pass."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from vlbert import BertConfig, BertForPreTraining


def test_flops_estimate_equals_counted_forward_flops():
    from vlbert.training.mfu import estimate_flops_per_token

    # A vocabulary of a multiple of 64: the MLM head pads others to one (MaskedLMHead.vocab_multiple), and the
    # padded rows' FLOPs are work the model does but the estimate (useful FLOPs) leaves out.
    config = BertConfig(
        vocab_size=320,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    # Training mode on CPU: attention runs as two counted matmuls (the CPU dropout path); SDPA's fused CPU
    # kernel is not counted by FlopCounterMode.
    model = BertForPreTraining(config).train()
    batch, seq_len = 4, 40
    ids = torch.randint(5, 300, (batch, seq_len))
    labels = torch.full_like(ids, -100)
    labels[:, :6] = ids[:, :6]  # 6 of 40 positions = the estimate's 15% masked fraction
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(ids, labels=labels, next_sentence_label=torch.zeros(batch, dtype=torch.long))
    estimated_forward = estimate_flops_per_token(config, seq_len) / 3 * batch * seq_len
    assert abs(counter.get_total_flops() - estimated_forward) <= 1e-9 * estimated_forward


def test_measuring_the_peak_leaves_the_global_random_generator_alone():
    """The trainer measures the CPU matmul peak at its first log line: drawing from the global generator there moved
    every later dropout mask, and a resumed run (which measures at another step) no longer matched."""
    from vlbert.training.mfu import measure_matmul_peak

    torch.manual_seed(0)
    state = torch.get_rng_state()
    assert measure_matmul_peak(torch.device("cpu"), torch.float32, size=64, repeats=1, trials=1) > 0
    assert torch.equal(torch.get_rng_state(), state)
