#!/usr/bin/env python
"""Side-by-side train-step benchmark: vlbert's BertForPreTraining vs transformers' BertForPreTraining.

Both models get the same weights and the same batch of real BBC News pretraining pairs (real lengths, so real
padding), and run forward + backward + AdamW step. Printed per pair: ms/step (median), real (non-pad) tokens/s,
peak memory, model FLOPs utilisation against a matmul peak measured in the same run, and the speedup.

    python tools/benchmark.py                      # default text config on CPU
    python tools/benchmark.py --device cuda --config configs/text/bert-base-128.yaml --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, size: int = 2048, repeats: int = 10) -> float:
    """Dense matmul FLOP/s of this device in this process (the MFU denominator)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync(device)
    return 2 * size ** 3 * repeats / (time.perf_counter() - start)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def real_batch(tokenizer, batch_size: int, max_seq_length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """One batch of real MLM + NSP pairs from BBC News (variable lengths, padded to the longest)."""
    from vlbert.data.corpus import load_documents, split_sentences
    from vlbert.data.pretraining import MaskingCollator, TextPretrainingDataset, tokenize_documents

    docs = tokenize_documents(load_documents("bbc-news")[:300], tokenizer, split_sentences)
    data = TextPretrainingDataset(docs, tokenizer, max_seq_length, seed=seed)
    collator = MaskingCollator.from_tokenizer(tokenizer)
    return collator([data[i] for i in range(batch_size)])


def time_train_steps(model, batch: dict, device: torch.device, steps: int, warmup: int, autocast: bool,
                     fused: bool) -> dict[str, float]:
    model.train().to(device)
    batch = {k: v.to(device) for k, v in batch.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(warmup + steps):
        sync(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2 ** 20 if device.type == "cuda" else float("nan")
    return {"ms_per_step": statistics.median(times) * 1e3, "peak_memory_mb": peak}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "text" / "default.yaml"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", action="store_true", help="one JSON line per pair")
    args = p.parse_args(argv)

    import transformers

    from vlbert import BertConfig, BertForPreTraining
    from vlbert.checkpoint import vlbert_to_hf
    from vlbert.models.bert import estimate_flops_per_token
    from vlbert.tokenization import load_tokenizer
    from vlbert.training.run_config import load_run_config

    device = torch.device(args.device)
    run = load_run_config(args.config)
    tokenizer = load_tokenizer(run.get("tokenizer"))
    model_values = {"vocab_size": len(tokenizer), **(run.get("model") or {})}
    config = BertConfig.from_dict(model_values, strict=True)
    batch_size = args.batch_size or run.get("training", {}).get("batch_size", 32)
    max_seq_length = run.get("data", {}).get("max_seq_length", 128)
    batch = real_batch(tokenizer, batch_size, max_seq_length)
    real_tokens = int(batch["attention_mask"].sum())

    torch.manual_seed(0)
    ours = BertForPreTraining(config)
    hf = transformers.BertForPreTraining(transformers.BertConfig(**config.to_dict()))
    hf.load_state_dict(vlbert_to_hf(ours.state_dict()), strict=False)  # decoder weight/bias are tied in HF

    bf16 = device.type == "cuda"
    peak = measure_matmul_peak(device, torch.bfloat16 if bf16 else torch.float32)
    flops = estimate_flops_per_token(config, batch["input_ids"].shape[1]) * real_tokens
    results = {}
    for name, model in (("transformers", hf), ("vlbert", ours)):
        r = time_train_steps(model, batch, device, args.steps, args.warmup, bf16, fused=device.type == "cuda")
        r["real_tokens_per_s"] = real_tokens / (r["ms_per_step"] / 1e3)
        r["mfu"] = flops / (r["ms_per_step"] / 1e3) / peak
        results[name] = r
    speedup = results["transformers"]["ms_per_step"] / results["vlbert"]["ms_per_step"]
    shape = tuple(batch["input_ids"].shape)
    record = {"model": "text", "device": str(device), "batch": list(shape), "real_tokens": real_tokens,
              "peak_tflops": peak / 1e12, "speedup": speedup,
              **{f"{k}_{m}": v for k, r in results.items() for m, v in r.items()}}
    if args.json:
        print(json.dumps(record))
    else:
        print(f"text pretraining step, {device}, batch {shape} ({real_tokens} real tokens, "
              f"{100 * real_tokens / (shape[0] * shape[1]):.0f}% of the padded grid), "
              f"L={config.num_hidden_layers} H={config.hidden_size}, matmul peak {peak / 1e12:.2f} TFLOP/s")
        print(f"{'model':<14}{'ms/step':>10}{'tokens/s':>12}{'peak MiB':>10}{'MFU':>8}")
        for name, r in results.items():
            print(f"{name:<14}{r['ms_per_step']:>10.1f}{r['real_tokens_per_s']:>12.0f}"
                  f"{r['peak_memory_mb']:>10.0f}{100 * r['mfu']:>7.1f}%")
        print(f"speedup of vlbert over transformers: {speedup:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
