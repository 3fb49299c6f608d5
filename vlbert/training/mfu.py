"""Model FLOPs utilisation: the model FLOPs a training step needs per position the encoder runs (nanoGPT's
``estimate_mfu``, PaLM appendix B; for a single-stream vision-language model the text tokens and the regions), and
the peak they are measured against: the device's datasheet (a small table of NVIDIA GPUs, dense bf16 / TF32,
matched by the exact model name) or, on a CPU or an unknown GPU, a matmul timed in this process (labelled so)."""

from __future__ import annotations

import functools
import time

import torch

#: Datasheet dense matmul peaks in FLOP/s (NVIDIA product briefs, without sparsity): (bf16/fp16, TF32; for the
#: V100 and T4, which have no TF32, plain float32). A key is a model, or a model and its form factor where the
#: forms differ ("H100" is the SXM board; the PCIe and NVL boards run slower clocks). :func:`datasheet_key` maps
#: a device name to a key.
DATASHEET_PEAK_FLOPS = {
    "H200": (989e12, 495e12),
    "H200 NVL": (835e12, 418e12),
    "H100": (989e12, 495e12),
    "H100 PCIe": (756e12, 378e12),
    "H100 NVL": (835e12, 418e12),
    "A100": (312e12, 156e12),
    "L40S": (362e12, 183e12),
    "L40": (181e12, 90.5e12),
    "L4": (121e12, 60e12),
    "A10": (125e12, 62.5e12),
    "V100": (125e12, 15.7e12),
    "V100 PCIe": (112e12, 14e12),
    "T4": (65e12, 8.1e12),
}

_FORMS = {"pcie": "PCIe", "nvl": "NVL"}


def datasheet_key(device_name: str) -> str | None:
    """The :data:`DATASHEET_PEAK_FLOPS` key of a CUDA device name (``torch.cuda.get_device_name``), or None.

    The name is split into words at spaces and hyphens, the vendor words ("NVIDIA", "Tesla") dropped; the first
    word left is the model and must equal a key's model exactly, so "NVIDIA L40" is the L40, never the L4, and an
    "A10G" is not an A10. A "PCIe" or "NVL" word picks that form's entry where the table has one. Examples:
    "NVIDIA H100 80GB HBM3" -> "H100"; "NVIDIA H100 PCIe" -> "H100 PCIe"; "NVIDIA A100-SXM4-80GB" -> "A100";
    "Tesla V100-SXM2-32GB" -> "V100"; "NVIDIA GeForce RTX 4090" -> None.
    """
    words = [w for w in device_name.lower().replace("-", " ").replace("_", " ").split() if w not in ("nvidia", "tesla")]
    if not words:
        return None
    model = words[0].upper()
    forms = [f"{model} {_FORMS[w]}" for w in words[1:] if w in _FORMS]
    return next((key for key in forms + [model] if key in DATASHEET_PEAK_FLOPS), None)


def estimate_flops_per_token(config, seq_len: float, masked_fraction: float = 0.15, with_heads: bool = True) -> float:
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


def estimate_step_flops(
    config, tokens: float, sequences: float, regions: float = 0.0, masked_fraction: float = 0.15
) -> float:
    """Model FLOPs of one training step over ``sequences`` sequences holding ``tokens`` real text tokens and
    ``regions`` real regions: every position the encoder runs, text and regions alike (a single-stream model
    runs both through every layer).

    = the encoder's FLOPs per position (:func:`estimate_flops_per_token` without heads) at the mean total length
    (tokens + regions) / sequences, times the positions; + the heads as for text (the MLM head on
    ``masked_fraction`` of the text tokens, the pooler and a 2-way head once per sequence), forward + backward;
    + the region pathway's input projection, (region_feature_dim + region_location_dim) x hidden per region,
    forward and weight gradient only (the detector's features need no gradient): 1.2% of a UNITER-base region
    position. With ``regions`` 0 this equals ``estimate_flops_per_token(config, tokens / sequences) * tokens``.
    Checked against ``torch.utils.flop_counter.FlopCounterMode`` on a VL forward + backward
    (tests/training/test_mfu.py). ``config``: a :class:`~vlbert.config.BertConfig` (or ``VLBertConfig`` where ``regions``).
    """
    positions = tokens + regions
    if not positions or not sequences:
        return 0.0
    h = config.hidden_size
    if getattr(config, "encoder", "single-stream") == "two-stream":
        flops = _two_stream_encoder_flops(config, tokens, regions, sequences)
    else:
        flops = estimate_flops_per_token(config, positions / sequences, with_heads=False) * positions
    flops += 3.0 * (masked_fraction * 2 * (h * h + h * config.vocab_size) * tokens + 2 * (h * h + 2 * h) * sequences)
    if regions:
        inputs = config.region_feature_dim + (getattr(config, "region_location_dim", 0) or 0)
        flops += 2.0 * 2 * inputs * h * regions
    return flops


def _two_stream_encoder_flops(config, tokens: float, regions: float, sequences: float) -> float:
    """Forward + backward FLOPs of LXMERT's two-stream encoder (:mod:`vlbert.models.two_stream`): the text through
    ``l_layers`` + ``x_layers`` BERT layers at the mean text length, the regions through ``r_layers`` + ``x_layers``
    at the mean region count, and per cross-modality layer the shared cross-attention of each stream over the
    other (query, key/value and output projections, scores and weighted sum). Same convention as
    :func:`estimate_flops_per_token`."""
    h, i = config.hidden_size, config.intermediate_size
    t, r = tokens / sequences, regions / sequences
    dense = 2 * (4 * h * h + 2 * h * i)
    forward = tokens * (config.l_layers + config.x_layers) * (dense + 4 * t * h)
    forward += regions * (config.r_layers + config.x_layers) * (dense + 4 * r * h)
    forward += config.x_layers * (2 * 4 * h * h * (tokens + regions) + 4 * h * (tokens * r + regions * t))
    return 3.0 * forward


def count_positions(batch: dict) -> tuple[int, int, int]:
    """(real text tokens, real regions, sequences) of a collated batch still on the host: the sums of its
    ``attention_mask`` [B, T] and ``region_mask`` [B, R] (1 = real; 0 regions without one) and B. (0, 0, 0) when
    the masks are missing or already on a device (counting there would synchronise the host)."""
    mask, regions = batch.get("attention_mask"), batch.get("region_mask")
    if not (torch.is_tensor(mask) and mask.device.type == "cpu"):
        return 0, 0, 0
    counted = torch.is_tensor(regions) and regions.device.type == "cpu"
    return int(mask.sum()), int(regions.sum()) if counted else 0, mask.shape[0]


def measure_matmul_peak(
    device: torch.device, dtype: torch.dtype, size: int = 512, repeats: int = 8, trials: int = 3
) -> float:
    """Dense matmul FLOP/s of this device in this process and dtype: the best of ``trials`` timings of
    ``repeats`` square matmuls, so a moment of load on a shared machine does not lower the peak. Draws nothing
    from the global random generator (a training run measures it mid-run: its dropout masks must not move). On a
    CPU core 512 x 512 matmuls reach what 1024 x 1024 ones do (73 and 75 GFLOP/s on one AMD EPYC core) in a
    quarter of the time (0.1 s); on CUDA the size is 8192 and ``repeats`` 50."""
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
    return 2 * size**3 * repeats / best


@functools.lru_cache(maxsize=None)
def device_peak_flops(device: torch.device, low_precision: bool) -> tuple[float, str]:
    """(peak FLOP/s, where it comes from) of ``device`` for bf16/fp16 (``low_precision``) or float32 training: the
    datasheet of a known GPU (:func:`datasheet_key` of its name), else a matmul measured once per process
    ("measured matmul" on a CPU or an unknown GPU)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        key = datasheet_key(name)
        if key is not None:
            half, tf32 = DATASHEET_PEAK_FLOPS[key]
            return (half if low_precision else tf32), f"datasheet {key} {'bf16' if low_precision else 'tf32'}"
    dtype = torch.bfloat16 if low_precision and device.type == "cuda" else torch.float32
    return measure_matmul_peak(device, dtype), f"measured matmul ({device.type}, {str(dtype).removeprefix('torch.')})"


__all__ = [
    "estimate_flops_per_token",
    "estimate_step_flops",
    "count_positions",
    "device_peak_flops",
    "measure_matmul_peak",
    "datasheet_key",
    "DATASHEET_PEAK_FLOPS",
]
