"""A memory plan: the peak GPU memory of one training step of a run config on one GPU, and the largest batch that
fits 24, 40, 80 and 141 GB.

    python -m benchmarks memory --config text/bert-base-128 --batch-size 32
    python -m benchmarks memory --config vl/uniter-base --batch-size 64 --set model.gradient_checkpointing=true
    vlbert benchmark memory --config vl/uniter-base --batch-size 64 --set model.hidden_size=1024 ...   # large

How (the method and its bias are in docs/performance.md, "Memory plan"): the step is traced on a fake CUDA device
under torch's memory tracker (:mod:`benchmarks.memory_trace`; shapes and dtypes only, no GPU needed), at
``--batch-size`` B and at 2B (or more), each in a fresh trace. The step is the bf16-params one (``mixed_precision: auto`` on a
GPU): bfloat16 parameters (2 bytes each), float32 masters (4), float32 gradients (4), fused AdamW's two float32
moments over the masters (8), with its state made before the traced step; the batch copied to the device, forward,
backward, optimizer step. One GPU, nothing sharded: with N-way FSDP2 sharding the parameter, gradient and optimizer
part divides by N (printed for N = 8). Batches are full: every sequence ``data.max_seq_length`` tokens (text; MLM +
NSP) or ``data.max_text_length`` tokens and ``data.max_regions`` regions (VL; the MLM objective), ``MASKED`` of the
text masked.

The largest batch: the peak is linear in the batch size (fixed + per sequence x B) through two traced sizes where
the activations make it, near the smallest GPU's limit (:func:`line_traces`), solved for each GPU, whose memory is taken as N GiB (what the device reports is within 2% of it: an "80 GB" H100
has 79.6 GiB), of which ``USABLE`` is left to the step (the rest: the CUDA context, about 0.5 GiB, and the
caching allocator's fragmentation).

Model sizes come from the config's ``model`` section over BERT-base's defaults (``init_from`` is not read: a hub
name needs the network); ``--set model.key=value`` overrides them, as the tools' ``--set`` does
(``model.gradient_checkpointing=true``: each encoder layer recomputed in the backward).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict
from typing import Sequence

import torch

from benchmarks.memory_trace import StepMemory, trace_step
from vlbert import BertConfig, BertForPreTraining, VLBertConfig
from vlbert.layers.losses import masked_positions
from vlbert.layers.unpadded import unpadded_layout
from vlbert.models.vl import VLBertForPreTraining
from vlbert.training.run_config import load_run_config

#: GPU memory sizes the plan answers for (L4 / A10, A100 40GB, A100 / H100 80GB, H200), GiB.
GPU_GB = (24, 40, 80, 141)
#: the share of a GPU's memory a step may use (the rest: CUDA context, allocator fragmentation).
USABLE = 0.9
#: the line's second trace must add at least this share of the first's activations (:func:`line_traces`)
LINEAR = 0.8
MAX_BATCH = 4096
#: the share of text tokens masked in the traced batch
MASKED = 0.15
#: the sharding the plan also prints (FSDP2 over this many GPUs divides the static part by it)
SHARDS = 8
GIB = 2**30


def model_config(run: dict) -> BertConfig:
    """The model config of a run config dict: its ``model`` section over BERT-base's defaults, a
    :class:`~vlbert.config.VLBertConfig` for ``modality: vl`` (else a :class:`~vlbert.config.BertConfig`).

    Raises:
        ValueError: a fine-tuning config (``task``: the plan traces pretraining steps), or a ``model`` key the config
            class does not have (its own message)."""
    if run.get("task"):
        raise ValueError(
            f"--config is a fine-tuning recipe (task: {run['task']}); the memory plan traces pretraining steps: give "
            "a text/ or vl/ config (its model section is the fine-tuning model's encoder)"
        )
    cls = VLBertConfig if run.get("modality", "text") == "vl" else BertConfig
    return cls.from_dict(dict(run.get("model") or {}), strict=True)


def host_batch(config: BertConfig, run: dict, batch_size: int) -> dict:
    """A full training batch on the host (int64 text [B, T], float16 regions [B, R, D] for VL), with the collator's
    unpadded layout and MLM positions: every sequence at the config's length, ``MASKED`` of its tokens masked."""
    data = run.get("data") or {}
    vl = isinstance(config, VLBertConfig)
    t = int(data.get("max_text_length", 40) if vl else data.get("max_seq_length", 128))
    mask = torch.ones(batch_size, t, dtype=torch.long)
    labels = torch.full((batch_size, t), -100)
    labels[:, 1 : t - 1 : round(1 / MASKED)] = 5
    batch = {
        "input_ids": torch.full((batch_size, t), 7),
        "token_type_ids": torch.zeros(batch_size, t, dtype=torch.long),
        "attention_mask": mask,
        "labels": labels,
        "masked_lm_positions": masked_positions(labels),
    }
    if not vl:
        batch["next_sentence_label"] = torch.zeros(batch_size, dtype=torch.long)
        batch["layout"] = unpadded_layout(mask)
        return batch
    r = int(data.get("max_regions", 36))
    region_mask = torch.ones(batch_size, r, dtype=torch.long)
    batch["region_features"] = torch.zeros(batch_size, r, config.region_feature_dim, dtype=torch.float16)
    batch["region_boxes"] = torch.tensor([0.1, 0.1, 0.6, 0.6]).expand(batch_size, r, 4).contiguous()
    batch["region_mask"] = region_mask
    batch["layout"] = unpadded_layout(mask, region_mask)
    return batch


def trace(config: BertConfig, run: dict, batch_size: int) -> StepMemory:
    """The memory of a bf16-params pretraining step of ``config`` on a full batch of ``batch_size``
    (:func:`host_batch`), traced on a fake GPU (:func:`benchmarks.memory_trace.trace_step`); bytes."""
    cls = VLBertForPreTraining if isinstance(config, VLBertConfig) else BertForPreTraining
    return trace_step(lambda: cls(config), host_batch(config, run, batch_size), batch_size)


def line_traces(config: BertConfig, run: dict, first: StepMemory) -> tuple[StepMemory, StepMemory]:
    """Two traces on the peak's line in the batch size near where the smallest GPU runs out. The peak is the
    largest of a few lines in the batch size (where the backward ends: the same for every batch; its start: the
    steepest), so the line is taken where the activations make the peak: ``first`` and twice its batch, doubled
    again (up to ``MAX_BATCH``) while the second's peak rose by less than ``LINEAR`` of the first's activations;
    then, where that line's largest batch for ``GPU_GB[0]`` is further out, half that batch and that batch."""
    small, large = first, trace(config, run, 2 * first.batch_size)
    while large.peak - small.peak < LINEAR * small.activations and large.batch_size < MAX_BATCH:
        small, large = large, trace(config, run, 2 * large.batch_size)
    far = largest_batches(small, large, gpus=GPU_GB[:1])[GPU_GB[0]]
    if far > 2 * large.batch_size:
        small, large = trace(config, run, far // 2), trace(config, run, far)
    return small, large


def largest_batches(small: StepMemory, large: StepMemory, gpus=GPU_GB, shards: int = 1) -> dict[int, int]:
    """GPU size in GiB -> the largest batch whose peak, on the line through the two traced steps, fits ``USABLE``
    of it (0: not even one sequence); with ``shards``, the parameters, gradients and optimizer state alive at the
    peak divided among that many GPUs (FSDP2)."""
    per_sequence = (large.peak - small.peak) / (large.batch_size - small.batch_size)
    sharded = (large.parameters + large.gradients + large.optimizer) * (1 - 1 / shards)
    fixed = large.peak - per_sequence * large.batch_size - sharded
    return {gb: max(0, math.floor((gb * GIB * USABLE - fixed) / per_sequence)) for gb in gpus}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks memory",
        description="Peak GPU memory of a training step of a run config on one GPU (a fake-CUDA trace; no GPU "
        "needed) and the largest batch that fits 24, 40, 80 and 141 GB.",
    )
    p.add_argument("--config", required=True, help="a run config: a YAML file or a shipped name (text/bert-base-128)")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per step (also traced at twice this)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config entry")
    p.add_argument("--json", action="store_true", help="one JSON line")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tool with ``argv`` (module docstring); returns 0.

    Raises:
        FileNotFoundError: ``--config`` names no file and no shipped config.
        ValueError: ``--batch-size`` below 1, or a ``model`` key the model's config does not have."""
    args = parse_args(argv)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {args.batch_size}")
    run = load_run_config(args.config, args.set)
    config = model_config(run)
    first = trace(config, run, args.batch_size)
    small, large = line_traces(config, run, first)
    fits, sharded = largest_batches(small, large), largest_batches(small, large, shards=SHARDS)
    if args.json:
        record = {"config": args.config, "overrides": args.set, **asdict(first), "largest_batch": fits}
        print(json.dumps({**record, f"largest_batch_fsdp{SHARDS}": sharded}))
        return 0
    print(f"{args.config} {' '.join(args.set)}: {first.num_parameters / 1e6:.1f}M parameters, batch {args.batch_size}")
    for part in ("parameters", "gradients", "optimizer", "activations", "peak"):
        print(f"  {part:12s} {getattr(first, part) / GIB:7.2f} GiB")
    print(f"  (at the peak; parameters + every gradient + optimizer state: {first.static / GIB:.2f} GiB)")
    line = f"batch {small.batch_size}: {small.peak / GIB:.2f} GiB, {large.batch_size}: {large.peak / GIB:.2f} GiB"
    print(f"  line through {line}")
    print("  largest batch, one GPU: " + ", ".join(f"{gb} GB: {b}" for gb, b in fits.items()))
    print(
        f"  {SHARDS}-way FSDP2 (parameters + gradients + optimizer {small.static / SHARDS / GIB:.2f} GiB per GPU): "
        + ", ".join(f"{gb} GB: {b}" for gb, b in sharded.items())
    )
    return 0


__all__ = ["GPU_GB", "USABLE", "model_config", "host_batch", "trace", "line_traces", "largest_batches", "main"]
