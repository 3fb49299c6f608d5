"""Side-by-side train-step benchmark against Hugging Face transformers, plus data-pipeline throughput.

Pairs (same weights where the architectures map, same batch, forward + backward + AdamW step, same optimizer
and precision on both sides):
  text: vlbert BertForPreTraining   vs transformers BertForPreTraining   (MLM + NSP on real BBC News pairs)
  vl:   vlbert VLBertForPreTraining vs transformers VisualBertForPreTraining (MLM + image-text matching on
        easy-VQA captions with 4..16 regions per image)
Printed per pair: ms/step (median), real (non-pad) tokens/s, peak memory, model FLOPs utilisation against a
matmul peak measured in the same run, and the speedup. Data: tokenisation + pairing + masking samples/s, and
region-shard read throughput.

    python tools/benchmark.py                       # CPU, fp32
    python tools/benchmark.py --bf16                # bf16 autocast on both sides (AMX CPUs, GPUs)
    python tools/benchmark.py --device cuda --config configs/text/bert-base-128.yaml --batch-size 64 --json
    python tools/benchmark.py --device cuda --compile   # the whole vlbert model through torch.compile
    python tools/benchmark.py --trainer --pairs text    # + the same model, batch and data through the real trainer

With ``--trainer`` the text pair's config also runs through ``vlbert.recipes.run`` (the real trainer: loader,
length-grouped batches, logging, clipping, the fused AdamW) for ``--warmup`` + ``--steps`` steps at the same batch
size and the tools' default precision (``mixed_precision: auto``; ``--trainer-precision``); its real tokens/s after
the warmup steps is printed beside the bare step's, with the ratio and the MFU its log reports. On a GPU of
vlbert/training/mfu.py's datasheet table every MFU is also given against the datasheet peak.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from vlbert.detectors.regions import Regions
from vlbert.detectors.shards import read_shards, write_shards

from vlbert import BertConfig, BertForPreTraining, VLBertConfig
from vlbert.checkpoint import vlbert_to_hf
from vlbert.commands import flag_types as flags
from vlbert.data.corpus_pairs import CorpusPairsDataset
from vlbert.data.easy_vqa import CAPTION_TEMPLATES, COLORS, SHAPES
from vlbert.data.pretraining import MaskingCollator
from vlbert.data.token_corpus import TokenCorpus, prepare_corpus
from vlbert.models.bert import compile_model
from vlbert.models.vl import VLBertForPreTraining
from vlbert.processing.regions import pad_regions
from vlbert.recipes import RECIPES, run
from vlbert.tokenization import load_tokenizer
from vlbert.training.mfu import (
    count_positions,
    device_peak_flops,
    estimate_flops_per_token,
    estimate_step_flops,
    measure_matmul_peak,
)
from vlbert.training.run_config import load_run_config
from vlbert.utils import glibc, keep_freed_memory_in_process


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _heap_in_use() -> Callable[[], int]:
    """Bytes the process has allocated and not freed: glibc's ``mallinfo2`` (in-use heap + mmapped blocks, all
    arenas), which memory kept for reuse does not inflate; the resident set size where that is unavailable."""

    mallinfo2 = getattr(glibc(), "mallinfo2", None)  # glibc >= 2.33
    if mallinfo2 is None:
        import psutil

        process = psutil.Process()
        return lambda: process.memory_info().rss
    mallinfo2.restype = _MallInfo2

    def in_use() -> int:
        info = mallinfo2()
        return info.uordblks + info.hblkhd

    return in_use


class PeakMemory:
    """Peak memory during a block, MiB above the level at entry: the CUDA allocator's peak, or on CPU the bytes
    allocated by the process (sampled every 2 ms)."""

    def __init__(self, device: torch.device):
        self.device, self.peak = device, float("nan")

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            return self
        self._in_use = _heap_in_use()
        self._base = self._max = self._in_use()
        self._stop = False

        def sample():
            while not self._stop:
                self._max = max(self._max, self._in_use())
                time.sleep(0.002)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated() / 2**20
        else:
            self._stop = True
            self._thread.join()
            self.peak = (self._max - self._base) / 2**20


def make_train_step(model, batch: dict, device: torch.device, bf16: bool) -> Callable[[], None]:
    """One forward + backward + AdamW step of ``model`` on ``batch`` (moved to ``device``), as a closure."""
    model.train().to(device)
    batch = {k: v.to(device) for k, v in batch.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def time_train_steps(
    steps_by_name: dict[str, Callable[[], None]], device: torch.device, steps: int, warmup: int, block: int = 5
) -> dict[str, dict]:
    """Median ms per training step of each implementation, and the peak memory of a step above what the weights
    and optimizer state hold (MiB).

    The implementations are timed in alternating blocks of ``block`` steps (the first step of a block warms it up
    again and is not counted), so that load drifting on a shared machine affects every side alike.
    """
    for step in steps_by_name.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps_by_name}
    while min(len(t) for t in times.values()) < steps:
        for name, step in steps_by_name.items():
            for i in range(block):
                sync(device)
                start = time.perf_counter()
                step()
                sync(device)
                if i > 0:
                    times[name].append(time.perf_counter() - start)
    results = {}
    for name, step in steps_by_name.items():
        with PeakMemory(device) as memory:  # measured apart from the timed steps: sampling takes malloc's lock
            for _ in range(2):
                step()
            sync(device)
        results[name] = {"ms_per_step": statistics.median(times[name]) * 1e3, "peak_memory_mib": memory.peak}
    return results


def bbc_news_pairs(tokenizer, max_seq_length: int):
    """BERT pairs from the embedded BBC News corpus, prepared once into the default corpus cache."""
    corpus = TokenCorpus(prepare_corpus("bbc-news", tokenizer))
    return CorpusPairsDataset(
        corpus, np.arange(corpus.num_documents), tokenizer, max_seq_length, seed=0, cache_name="benchmark"
    )


def text_pair(run: dict, tokenizer, batch_size: int):
    """(vlbert model, transformers model, vlbert batch, transformers batch, config, real tokens)."""
    import transformers

    config = BertConfig.from_dict({"vocab_size": len(tokenizer), **(run.get("model") or {})}, strict=True)
    data = bbc_news_pairs(tokenizer, run.get("data", {}).get("max_seq_length", 128))
    batch = MaskingCollator.from_tokenizer(tokenizer)([data[i] for i in range(batch_size)])
    torch.manual_seed(0)
    ours = BertForPreTraining(config)
    hf = transformers.BertForPreTraining(transformers.BertConfig(**config.to_dict()))
    hf.load_state_dict(vlbert_to_hf(ours.state_dict()), strict=False)  # HF ties decoder weight/bias itself
    return ours, hf, batch, batch, config, int(batch["attention_mask"].sum())


def vl_pair(tokenizer, batch_size: int, feature_dim: int = 1320, max_regions: int = 16):
    """The VL pair at the size of configs/vl/default.yaml (the packaged MiniLM: L=6, H=384, A=12)."""
    import transformers

    config = VLBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        region_feature_dim=feature_dim,
        num_region_classes=1000,
    )
    rng = np.random.default_rng(0)
    texts = [
        {
            "input_ids": tokenizer(CAPTION_TEMPLATES[i % 5].format(color=COLORS[i % 8], shape=SHAPES[i % 3]))[
                "input_ids"
            ],
            "mask_seed": i,
        }
        for i in range(batch_size)
    ]
    collator = MaskingCollator.from_tokenizer(tokenizer, objectives=("mlm",))  # captions: no sentence pairs
    batch = collator(texts)
    counts = rng.integers(4, max_regions + 1, batch_size)
    items = []
    for n in counts:
        xy = rng.random((n, 2)) * 0.5
        items.append(
            {
                "region_features": rng.standard_normal((n, feature_dim)).astype(np.float16),
                "region_boxes": np.concatenate([xy, xy + rng.random((n, 2)) * 0.5], 1).astype(np.float32),
            }
        )
    regions = pad_regions(items)
    itm = torch.tensor(rng.integers(0, 2, batch_size))
    ours_batch = {**batch, **regions, "itm_label": itm}
    t, r = batch["input_ids"].shape[1], regions["region_mask"].shape[1]
    hf_batch = {
        "input_ids": batch["input_ids"],
        "token_type_ids": batch["token_type_ids"],
        "attention_mask": batch["attention_mask"],
        "visual_embeds": regions["region_features"].float(),
        "visual_attention_mask": regions["region_mask"],
        "labels": torch.cat([batch["labels"], torch.full((batch_size, r), -100)], 1),
        "sentence_image_labels": itm,
    }
    torch.manual_seed(0)
    ours = VLBertForPreTraining(config)
    hf_config = transformers.VisualBertConfig(
        **{k: v for k, v in config.to_dict().items() if k not in ("model_type", "region_feature_dim")},
        visual_embedding_dim=feature_dim,
    )
    hf = transformers.VisualBertForPreTraining(hf_config)
    mapped = {
        ("visual_bert." + k[len("bert.") :] if k.startswith("bert.") else k): v
        for k, v in vlbert_to_hf(ours.state_dict()).items()
    }
    hf.load_state_dict(mapped, strict=False)  # encoder, text embeddings, MLM head; region parts differ
    real = int(batch["attention_mask"].sum() + regions["region_mask"].sum())
    config.seq_len = t + r
    return ours, hf, ours_batch, hf_batch, config, real


def data_pipeline(tokenizer) -> dict:
    """Samples/s of BBC News tokenisation + pair building + masking, and region-shard read throughput."""
    data = bbc_news_pairs(tokenizer, 128)  # prepared once (cached): the rate is of pairs + masking
    start = time.perf_counter()
    collator = MaskingCollator.from_tokenizer(tokenizer)
    n = min(len(data), 2048)
    for s in range(0, n, 32):
        collator([data[i] for i in range(s, min(s + 32, n))])
    text_rate = n / (time.perf_counter() - start)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        regions = [
            Regions(
                str(i),
                480,
                640,
                np.tile([[0, 0, 640, 480]], (36, 1)),
                rng.standard_normal((36, 2048)),
                np.ones(36),
                None,
                "bench",
            )
            for i in range(300)
        ]
        paths = write_shards(regions, tmp, max_samples_per_shard=100)
        size = sum(p.stat().st_size for p in paths)
        start = time.perf_counter()
        n = sum(1 for _ in read_shards(paths))
        elapsed = time.perf_counter() - start
    return {
        "model": "data",
        "text_pairs_per_s": text_rate,
        "shard_images_per_s": n / elapsed,
        "shard_mib_per_s": size / 2**20 / elapsed,
        "shard_regions_per_image": 36,
        "shard_feature_dim": 2048,
    }


def trainer_throughput(config_path: str, batch_size: int, warmup: int, steps: int, precision: str) -> dict:
    """Real tokens/s of the text config through the real trainer at ``training.mixed_precision`` = ``precision``
    (the tools' ``auto``: bf16 computation over float32 FSDP2 shards on CUDA) after ``warmup`` steps (the mean of the log
    windows that follow), its data_wait_fraction there and the MFU it logs (datasheet peak on a known GPU)."""

    warmup = max(1, warmup)
    total = warmup * (1 + max(1, round(steps / warmup)))
    with tempfile.TemporaryDirectory() as out:
        config = load_run_config(
            config_path,
            [
                f"training.output_dir={out}",
                f"training.batch_size={batch_size}",
                f"training.max_steps={total}",
                f"training.log_every={warmup}",
                "training.eval_every=0",
                "training.save_every=0",
                "training.progress_bar=false",
                f"training.mixed_precision={precision}",
                "data.max_eval_batches=1",
            ],
        )
        run(RECIPES["text-pretraining"], config)
        records = [json.loads(line) for line in (Path(out) / "log.jsonl").read_text().splitlines()]
    timed = [r for r in records if r["split"] == "train"][1:]
    return {
        "trainer_precision": precision,
        "trainer_real_tokens_per_s": statistics.mean(r["tokens_per_s"] for r in timed),
        "trainer_data_wait_fraction": statistics.mean(r["data_wait_fraction"] for r in timed),
        "trainer_mfu": statistics.mean(r.get("mfu", 0.0) for r in timed),
        "trainer_steps_timed": total - warmup,
    }


def print_pair(name: str, record: dict, results: dict, config) -> None:
    """The human-readable table of one pair's record."""
    batch, seq_len = record["batch"]
    print(
        f"\n{name} pretraining step on {record['device']} ({record['dtype']}): batch {batch} x "
        f"{seq_len} positions, {record['real_tokens']} real ({100 * record['real_fraction']:.0f}%), "
        f"L={config.num_hidden_layers} H={config.hidden_size}; matmul peak {record['peak_tflops']:.2f} TFLOP/s"
        + ("; malloc keeps freed memory (both sides)" if record["malloc_keeps_freed_memory"] else "")
    )
    datasheet = record.get("datasheet")
    print(f"{'':<14}{'ms/step':>10}{'tokens/s':>12}{'peak MiB':>10}{'MFU':>8}" + "  datasheet MFU" * bool(datasheet))
    for impl, r in results.items():
        print(
            f"{impl:<14}{r['ms_per_step']:>10.1f}{r['real_tokens_per_s']:>12.0f}"
            f"{r['peak_memory_mib']:>10.0f}{100 * r['mfu']:>7.1f}%"
            + (f"{100 * r['mfu_datasheet']:>14.1f}%" if datasheet else "")
        )
    print(f"speedup of vlbert over transformers: {record['speedup']:.2f}x" + f"; {datasheet}" * bool(datasheet))
    if "trainer_real_tokens_per_s" in record:
        print(
            f"through the trainer (mixed_precision {record['trainer_precision']}): "
            f"{record['trainer_real_tokens_per_s']:.0f} tokens/s = "
            f"{100 * record['trainer_over_bare_step']:.0f}% of the bare step "
            f"(data wait {100 * record['trainer_data_wait_fraction']:.1f}% of the step time), logged MFU "
            f"{100 * record['trainer_mfu']:.1f}%"
        )


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="text/default", help="text pair's config")
    p.add_argument("--device", type=flags.device, default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-size", type=flags.count, default=32)
    p.add_argument(
        "--steps", type=flags.count, default=16, help="timed steps per implementation (in alternating blocks)"
    )
    p.add_argument("--warmup", type=flags.count_or_zero, default=3)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast on both sides (default on CUDA)")
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the whole vlbert model (training.compile; the warmup steps compile)",
    )
    p.add_argument("--pairs", default="text,vl,data", help="comma-separated subset of text, vl, data")
    p.add_argument("--json", action="store_true", help="one JSON line per pair")
    p.add_argument(
        "--trainer",
        action="store_true",
        help="also run the text pair's config through the real trainer and compare tokens/s",
    )
    p.add_argument(
        "--trainer-precision",
        default="auto",
        choices=("auto", "no", "bf16", "bf16-params"),
        help="of the --trainer run (auto, as the tools: bf16 computation over float32 FSDP2 shards on CUDA)",
    )
    p.add_argument(
        "--default-malloc",
        action="store_true",
        help="leave glibc's malloc as it is (by default freed memory is kept in the process, as the "
        "trainer does on CPU; this applies to both sides of each pair)",
    )
    return p.parse_args(argv)


def model_pair(name: str, args: argparse.Namespace, tokenizer):
    """The ``"text"`` (:func:`text_pair` of ``args.config``) or ``"vl"`` (:func:`vl_pair`) pair: (vlbert model,
    transformers model, their batches, the config, the batch's real tokens, its sequence length, the FLOPs of one
    training step on it: per real token for text, over every position for VL as the trainer's MFU counts them)."""
    if name == "text":
        ours, hf, ours_batch, hf_batch, config, real = text_pair(
            load_run_config(args.config), tokenizer, args.batch_size
        )
        seq_len = ours_batch["input_ids"].shape[1]
        return ours, hf, ours_batch, hf_batch, config, real, seq_len, estimate_flops_per_token(config, seq_len) * real
    ours, hf, ours_batch, hf_batch, config, real = vl_pair(tokenizer, args.batch_size)
    tokens, regions, sequences = count_positions(ours_batch)
    flops = estimate_step_flops(config, tokens, sequences, regions)
    return ours, hf, ours_batch, hf_batch, config, real, config.seq_len, flops


def add_rates(results: dict, real: int, flops: float, peak: float, datasheet_peak: float | None = None) -> None:
    """Add to each timing of :func:`time_train_steps` its real tokens per second and its MFU: ``flops`` per step
    over the measured matmul ``peak`` (FLOP/s), and over ``datasheet_peak`` where given (``mfu_datasheet``)."""
    for r in results.values():
        r["real_tokens_per_s"] = real / (r["ms_per_step"] / 1e3)
        r["mfu"] = flops / (r["ms_per_step"] / 1e3) / peak
        if datasheet_peak is not None:
            r["mfu_datasheet"] = flops / (r["ms_per_step"] / 1e3) / datasheet_peak


def main(argv=None) -> int:
    """Run the tool with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit
    status (0). Errors propagate for :func:`vlbert.commands.run_tool` to report."""
    args = parse_args(argv)

    device = torch.device(args.device)
    kept = device.type == "cpu" and not args.default_malloc and keep_freed_memory_in_process()
    bf16 = args.bf16 or device.type == "cuda"
    tokenizer = load_tokenizer()
    peak = measure_matmul_peak(device, torch.bfloat16 if bf16 else torch.float32, size=2048, repeats=5, trials=5)
    datasheet_peak, datasheet = device_peak_flops(device, bf16) if device.type == "cuda" else (None, "")
    datasheet = datasheet if datasheet.startswith("datasheet") else None  # (an unknown GPU: a measured matmul)
    wanted = args.pairs.split(",")
    records = []
    for name in ("text", "vl"):
        if name not in wanted:
            continue
        ours, hf, ours_batch, hf_batch, config, real, seq_len, flops = model_pair(name, args, tokenizer)
        padded = ours_batch["input_ids"].shape[0] * seq_len
        if args.compile:
            compile_model(ours)
        results = time_train_steps(
            {
                "transformers": make_train_step(hf, hf_batch, device, bf16),
                "vlbert": make_train_step(ours, ours_batch, device, bf16),
            },
            device,
            args.steps,
            args.warmup,
        )
        add_rates(results, real, flops, peak, datasheet_peak if datasheet else None)
        hf.cpu()
        ours.cpu()
        record = {
            "model": name,
            "device": str(device),
            "dtype": "bf16" if bf16 else "fp32",
            "malloc_keeps_freed_memory": kept,
            "vlbert_compiled": args.compile,
            "batch": [ours_batch["input_ids"].shape[0], seq_len],
            "real_tokens": real,
            "real_fraction": real / padded,
            "peak_tflops": peak / 1e12,
            "datasheet": datasheet,
            "speedup": results["transformers"]["ms_per_step"] / results["vlbert"]["ms_per_step"],
            **{f"{impl}_{k}": v for impl, r in results.items() for k, v in r.items()},
        }
        if (
            args.trainer
            and name == "text"
            and str(device) == str(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        ):
            record.update(
                trainer_throughput(args.config, args.batch_size, args.warmup, args.steps, args.trainer_precision)
            )
            record["trainer_over_bare_step"] = record["trainer_real_tokens_per_s"] / record["vlbert_real_tokens_per_s"]
        records.append(record)
        if not args.json:
            print_pair(name, record, results, config)
    if "data" in wanted:
        record = data_pipeline(tokenizer)
        records.append(record)
        if not args.json:
            print(
                f"\ndata: {record['text_pairs_per_s']:.0f} text pairs/s (tokenise + pair + mask); region shards "
                f"{record['shard_images_per_s']:.0f} images/s = {record['shard_mib_per_s']:.0f} MiB/s "
                f"(36 regions x 2048 float16 each)"
            )
    if args.json:
        for record in records:
            print(json.dumps(record))
    return 0
