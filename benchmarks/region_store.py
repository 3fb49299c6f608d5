"""Peak memory of VL pretraining against the size of the region store, and the data loader's speed.

    python tools/benchmark_region_store.py --images 5000 50000 --steps 20

For each size: a synthetic store in the real shard format (36 regions x 2048 float16 features per image with 1600-way
class distributions, as bottom-up-attention extractions; random values), a JSONL caption file with one caption per
image, then ``tools/pretrain.py --modality vl`` for ``--steps`` steps on them (MiniLM L=6 H=384, the default VL
model, with 2048-d region inputs) in a child process whose peak RSS is read from the kernel (ru_maxrss). Also:
samples/s of one data-loader worker (dataset item + collation) against samples/s the model consumes. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from vlbert.detectors.config import DetectorConfig
from vlbert.detectors.regions import Regions
from vlbert.detectors.shards import write_shards

from vlbert.commands import flag_types as flags
from vlbert.recipes import RECIPES
from vlbert.recipes.runner import RunContext
from vlbert.recipes.vl_pretraining import VLDataConfig
from vlbert.tokenization import load_tokenizer, resolve_model_path
from vlbert.training.run_config import dataclass_from_section
from vlbert.training.trainer import TrainingConfig
from vlbert.utils import forward_arguments


def synthetic_store(directory: Path, count: int, regions: int = 36, dim: int = 2048, classes: int = 1600) -> None:
    rng = np.random.default_rng(0)
    boxes = np.array([[i, i, 100 + i, 80 + i] for i in range(regions)], dtype=np.float32)
    probs = rng.dirichlet(np.ones(classes), regions).astype(np.float16)

    def images():
        for i in range(count):
            yield Regions(
                f"img{i}",
                480,
                640,
                boxes,
                rng.standard_normal((regions, dim), dtype=np.float32),
                np.ones(regions),
                probs,
                "synthetic",
            )

    write_shards(images(), directory, max_samples_per_shard=1000)
    with open(directory.parent / "captions.jsonl", "w") as f:
        for i in range(count):
            f.write(json.dumps({"image_id": f"img{i}", "caption": f"a photo number {i} of a red {i % 7} thing"}) + "\n")


def run_config(root: Path, steps: int) -> dict:
    return {
        "modality": "vl",
        "init_from": "minilm",
        "model": {"region_feature_dim": 2048},
        "data": {
            "sources": [
                {
                    "name": "synthetic",
                    "format": "jsonl",
                    "path": str(root / "captions.jsonl"),
                    "shards": str(root / "shards"),
                }
            ],
            "eval_fraction": 0.0,
            "max_regions": 36,
            "max_text_length": 24,
        },
        "training": {
            "output_dir": str(root / "run"),
            "max_steps": steps,
            "batch_size": 32,
            "warmup_steps": 2,
            "log_every": 5,
            "progress_bar": False,
            "num_workers": 2,
        },
    }


def loader_rate(root: Path, batches: int = 30) -> dict:
    """Samples/s of dataset items + collation in this process (what one worker does)."""

    import torch

    config = run_config(root, 1)
    init = resolve_model_path("minilm")
    ctx = RunContext(
        config,
        TrainingConfig.from_dict(config["training"]),
        dataclass_from_section(VLDataConfig, config["data"], "data"),
        DetectorConfig(),
        load_tokenizer(init),
        init,
    )
    recipe = RECIPES["vl-pretraining"]
    data = recipe.build_data(ctx)
    start = time.perf_counter()
    n = 0
    for b in range(batches):
        items = [dict(data.train[(b * 32 + k) % len(data.train)], objective="mlm") for k in range(32)]
        data.collator(items)
        n += 32
    item_rate = n / (time.perf_counter() - start)
    model = recipe.build_model(ctx, data)
    batch = data.collator([dict(data.train[k], objective="mlm") for k in range(32)])
    accepted = forward_arguments(model)
    batch = {k: v for k, v in batch.items() if k in accepted}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for i in range(4):
        if i == 1:
            start = time.perf_counter()
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
    model_rate = 3 * 32 / (time.perf_counter() - start)
    return {
        "loader_samples_per_s_per_worker": round(item_rate, 1),
        "model_samples_per_s": round(model_rate, 1),
        "ratio": round(item_rate / model_rate, 1),
    }


def main(argv=None) -> int:
    """Run the tool with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit
    status (0). Errors propagate for :func:`vlbert.commands.run_tool` to report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=flags.count, nargs="+", default=[5000, 50000])
    p.add_argument("--steps", type=flags.count, default=20)
    p.add_argument("--workdir", help="keep the stores here (default: a temporary directory)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for count in args.images:
            root = Path(tmp) / f"store-{count}"
            start = time.perf_counter()
            synthetic_store(root / "shards", count)
            written = time.perf_counter() - start
            size = sum(f.stat().st_size for f in (root / "shards").glob("*.tar"))
            config = root / "config.json"
            config.write_text(json.dumps(run_config(root, args.steps)))
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "vlbert", "pretrain", "--modality", "vl", "--config", str(config)],
                capture_output=True,
                text=True,
                env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
            )
            wall = time.perf_counter() - start
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            record = {
                "images": count,
                "store_gib": round(size / 2**30, 2),
                "write_s": round(written, 1),
                "steps": args.steps,
                "run_s": round(wall, 1),
                "peak_rss_gib_largest_process": round(max(peak, before) / 2**20, 3),
            }
            record.update(loader_rate(root))
            print(json.dumps(record), flush=True)
    return 0
