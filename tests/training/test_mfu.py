"""The MFU a training log reports: the FLOPs a vision-language step does over every position the encoder runs
(text tokens and regions), against PyTorch's own count, and the datasheet peak picked by the exact GPU name."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vlbert
from vlbert.layers.unpadded import unpadded_layout
from vlbert.processing.padding import pad_text
from vlbert.processing.regions import pad_regions
from vlbert.training.mfu import (
    DATASHEET_PEAK_FLOPS,
    count_positions,
    datasheet_key,
    device_peak_flops,
    estimate_flops_per_token,
    estimate_step_flops,
    measure_matmul_peak,
)

# (torch.cuda.get_device_name as NVIDIA's drivers report it, the table entry it must take)
DEVICE_NAMES = [
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A100-PCIE-40GB", "A100"),
    ("NVIDIA A100 80GB PCIe", "A100"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA A10", "A10"),
    ("Tesla V100-SXM2-32GB", "V100"),
    ("Tesla V100-PCIE-16GB", "V100 PCIe"),
    ("Tesla T4", "T4"),
    # not in the table: measured, never a near name's datasheet
    ("NVIDIA A10G", None),
    ("NVIDIA A40", None),
    ("NVIDIA GeForce RTX 4090", None),
    ("NVIDIA RTX A6000", None),
    ("NVIDIA H800", None),
]


@pytest.mark.parametrize("name, key", DEVICE_NAMES)
def test_gpu_names_take_their_own_datasheet_entry(name, key):
    assert datasheet_key(name) == key


def test_an_l40_is_measured_against_the_l40s_datasheet_not_the_l4s(monkeypatch):
    """The substring match gave "NVIDIA L40" the L4's 121 TFLOP/s (a third of its own 181)."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA L40")
    device_peak_flops.cache_clear()
    try:
        peak, where = device_peak_flops(torch.device("cuda", 0), True)
    finally:
        device_peak_flops.cache_clear()
    assert (peak, where) == (DATASHEET_PEAK_FLOPS["L40"][0], "datasheet L40 bf16") and peak == 181e12


def vl_batch(texts=(9, 6, 11, 8), regions=(12, 5, 9, 16), masked=(1, 1, 2, 1), feature_dim=96):
    """A ragged VL batch as the VL collator lays it out (text and regions padded, unpadded layout), MLM
    labels on ``masked`` text positions of each pair (15% of the text tokens)."""
    g = torch.Generator().manual_seed(0)
    batch = pad_text([{"input_ids": torch.randint(5, 250, (t,), generator=g).tolist()} for t in texts], 0)
    batch.update(
        pad_regions(
            [
                {
                    "region_features": torch.randn(r, feature_dim, generator=g).half().numpy(),
                    "region_boxes": torch.tensor([[0.1, 0.1, 0.6, 0.7]]).repeat(r, 1).numpy(),
                }
                for r in regions
            ]
        )
    )
    labels = torch.full_like(batch["input_ids"], -100)
    for row, m in enumerate(masked):
        labels[row, 1 : 1 + m] = batch["input_ids"][row, 1 : 1 + m]
    batch.update(layout=unpadded_layout(batch["attention_mask"], batch["region_mask"]), labels=labels)
    return batch


def test_vl_flops_count_every_position_the_encoder_runs():
    """estimate_step_flops over the positions count_positions reads (as the trainer does) against FlopCounterMode's
    count of a real VL training forward + backward: the regions are most of the work, and they are counted."""
    # Eager attention (sdpa's fused CPU kernel is not counted) runs over the padded [T + R] x [T + R] scores, where
    # a GPU's varlen kernel runs each pair's own length: at a hidden size of 256 that padding is ~2% of the step.
    config = vlbert.VLBertConfig(
        vocab_size=512,
        hidden_size=256,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=1024,
        region_feature_dim=96,
        num_region_classes=0,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = vlbert.VLBertForPreTraining(config).train()
    batch = vl_batch()
    tokens, regions, sequences = count_positions(batch)
    assert (tokens, regions, sequences) == (34, 42, 4)
    with FlopCounterMode(display=False) as counter:
        model(**batch).loss.backward()
    counted = counter.get_total_flops()
    estimated = estimate_step_flops(config, tokens, sequences, regions, masked_fraction=5 / 34)
    text_only = estimate_flops_per_token(config, tokens / sequences, masked_fraction=5 / 34) * tokens
    print(
        f"counted {counted:.4g}, estimated {estimated:.4g} ({estimated / counted - 1:+.1%}), "
        f"text tokens only {text_only / counted:.0%}"
    )
    assert abs(estimated / counted - 1) < 0.03
    assert text_only < 0.5 * counted  # the figure logged before: regions left out


def test_the_step_estimate_of_a_text_batch_is_the_per_token_estimate():
    config = vlbert.BertConfig()
    assert estimate_step_flops(config, 1000, 8) == pytest.approx(
        estimate_flops_per_token(config, 125) * 1000, rel=1e-12
    )


def test_two_stream_flops_count_each_stream_and_the_cross_attention():
    """LXMERT's two streams (issue 42): the estimate against FlopCounterMode's count of a two-stream training
    forward + backward on the same batch (text through l + x layers, regions through r + x, cross-attention both
    ways), where a single-stream count of its layers would be far off."""
    config = vlbert.VLBertConfig(
        vocab_size=512,
        hidden_size=256,
        num_attention_heads=4,
        intermediate_size=1024,
        region_feature_dim=96,
        num_region_classes=0,
        attn_implementation="eager",
        encoder="two-stream",
        l_layers=2,
        r_layers=1,
        x_layers=1,
        region_embedding="lxmert",
        region_location_dim=4,
    )
    torch.manual_seed(0)
    model = vlbert.VLBertForPreTraining(config).train()
    # without the collator's joint layout each stream is unpadded by its mask, so the counter sees the real positions
    # only (given it, the streams run padded: no host sync, the padding's FLOPs spent but not counted as the model's)
    batch = {k: v for k, v in vl_batch().items() if k != "layout"}
    tokens, regions, sequences = count_positions(batch)
    with FlopCounterMode(display=False) as counter:
        model(**batch).loss.backward()
    counted = counter.get_total_flops()
    estimated = estimate_step_flops(config, tokens, sequences, regions, masked_fraction=5 / 34)
    print(f"counted {counted:.4g}, estimated {estimated:.4g} ({estimated / counted - 1:+.1%})")
    assert abs(estimated / counted - 1) < 0.05


def test_flops_estimate_equals_counted_forward_flops():
    """The per-token estimate (the numerator of every MFU the trainer and the benchmarks print) equals PyTorch's own
    count of the matmul FLOPs of a real text forward pass."""
    # A vocabulary of a multiple of 64: the MLM head pads others to one (MaskedLMHead.vocab_multiple), and the
    # padded rows' FLOPs are work the model does but the estimate (useful FLOPs) leaves out.
    config = vlbert.BertConfig(
        vocab_size=320,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    # Training mode on CPU: attention runs as two counted matmuls (the CPU dropout path); SDPA's fused CPU
    # kernel is not counted by FlopCounterMode.
    model = vlbert.BertForPreTraining(config).train()
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
    torch.manual_seed(0)
    state = torch.get_rng_state()
    assert measure_matmul_peak(torch.device("cpu"), torch.float32, size=64, repeats=1, trials=1) > 0
    assert torch.equal(torch.get_rng_state(), state)
