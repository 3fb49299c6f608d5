"""Model FLOPs utilisation: the model FLOPs a training step needs per token (nanoGPT's ``estimate_mfu``, PaLM
appendix B), and the peak they are measured against: the device's datasheet (a small table of NVIDIA GPUs, dense
bf16 / TF32) or, on a CPU, a matmul timed in this process (labelled so)."""

from __future__ import annotations

import functools
import time

import torch

#: Datasheet dense matmul peaks in FLOP/s (NVIDIA, SXM where there are two forms): (bf16/fp16, TF32 for float32).
DATASHEET_PEAK_FLOPS = {
    "H200": (989e12, 495e12),
    "H100": (989e12, 495e12),
    "A100": (312e12, 156e12),
    "L40S": (362e12, 183e12),
    "A10": (125e12, 62.5e12),
    "L4": (121e12, 60e12),
    "V100": (125e12, 15.7e12),
}


def estimate_flops_per_token(config, seq_len: float, masked_fraction: float = 0.15,
                             with_heads: bool = True) -> float:
    """Model FLOPs of one training step (forward + backward = 3 x forward) per real token of a sequence of
    ``seq_len`` positions.

    Counts the matrix multiplies (2 FLOPs per multiply-add): QKV, attention scores and values, output projection,
    feed-forward and, with ``with_heads``, the MLM head on ``masked_fraction`` of the tokens and the pooler with a
    2-way head amortised over the sequence. Embedding lookups, LayerNorm and softmax are not counted (nanoGPT's
    ``estimate_mfu`` / PaLM appendix B convention). ``config``: a :class:`~vlbert.config.BertConfig`.
    """
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    per_layer = 2 * (3 * h * h + h * h + 2 * h * i) + 2 * 2 * seq_len * h
    forward = layers * per_layer
    if with_heads:
        forward += masked_fraction * 2 * (h * h + h * config.vocab_size)
        forward += 2 * (h * h + 2 * h) / max(seq_len, 1)
    return 3.0 * forward


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, size: int = 1024, repeats: int = 4,
                        trials: int = 3) -> float:
    """Dense matmul FLOP/s of this device in this process and dtype: the best of ``trials`` timings of
    ``repeats`` square matmuls, so a moment of load on a shared machine does not lower the peak. Draws nothing
    from the global random generator (a training run measures it mid-run: its dropout masks must not move)."""
    if device.type == "cuda":
        size, repeats = 8192, 50
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=g)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=g)
    a @ b
    best = float("inf")
    for _ in range(trials):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 * repeats / best


@functools.lru_cache(maxsize=None)
def device_peak_flops(device: torch.device, low_precision: bool) -> tuple[float, str]:
    """(peak FLOP/s, where it comes from) of ``device`` for bf16/fp16 (``low_precision``) or float32 training: the
    datasheet of a known GPU, else a matmul measured once per process ("measured matmul" on a CPU or an unknown
    GPU)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, (half, tf32) in DATASHEET_PEAK_FLOPS.items():
            if key in name:
                return (half if low_precision else tf32), f"datasheet {key} {'bf16' if low_precision else 'tf32'}"
    dtype = torch.bfloat16 if low_precision and device.type == "cuda" else torch.float32
    return measure_matmul_peak(device, dtype), f"measured matmul ({device.type}, {str(dtype).removeprefix('torch.')})"


__all__ = ["estimate_flops_per_token", "device_peak_flops", "measure_matmul_peak", "DATASHEET_PEAK_FLOPS"]
