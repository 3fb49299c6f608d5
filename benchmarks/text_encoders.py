"""BERT and ModernBERT side by side at the default text run's budget: held-out MLM accuracy at one masking rate and
steps/s on this machine (issue 67 item 4).

    python -m benchmarks text-encoders [--steps 600] [--set KEY=VALUE ...] [--workdir DIR]

Two text pretraining runs in this process, of the same steps, batch, sequence length, corpus, held-out documents and
tokenizer: ``configs/text/default.yaml`` (BERT L=4 H=256: MLM + NSP at 15%, AdamW, linear decay) and
``configs/text/modernbert-default.yaml`` (ModernBERT L=4 H=256: MLM alone at 30%, StableAdamW, warmup-stable-decay),
both evaluated with ``data.eval_mlm_probability`` 0.15 (ModernBERT's rule: "always evaluate at 15%"). The warmup is
a tenth of ``--steps`` for both (60 of the default 600); ``--set`` applies to both runs. Per run it reports the
held-out MLM accuracy and its majority baseline (the run's metrics.json), the masked share of the wordpieces that
could be masked in the held-out batches the run evaluated and in its first training batch (rebuilt from the run's
config.yaml and counted: the rates the figures were measured at, not the configured ones), steps/s (steps over the
training seconds, and from the median step after the 4th) and parameters. Prints one JSON line per run, then a
Markdown table. The held-out pairs differ where NSP draws a random segment B (BERT's run, half the pairs); the
documents, segments A and masking rate are the same.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from vlbert.layers.losses import IGNORE_INDEX
from vlbert.recipes import RECIPES, run
from vlbert.recipes.config_reading import read_run_config
from vlbert.recipes.runner import RunContext
from vlbert.recipes.text_pretraining import ARCHITECTURES, TextPretrainingData, read_model_section
from vlbert.tokenization import load_tokenizer, resolve_model_path
from vlbert.training.run_config import load_run_config

#: (row name, shipped config): the default quick-start text run and the same budget with ModernBERT.
RUNS = (("bert", "text/default"), ("modernbert", "text/modernbert-default"))
#: The held-out masking rate of both runs.
EVAL_RATE = 0.15


def masked_share(batches, collator) -> float:
    """Masked wordpieces (labels other than -100) over the wordpieces the collator may mask (of the ids before
    masking: a [MASK] put in is a special token), over ``batches``."""
    masked = maskable = 0
    for batch in batches:
        chosen = batch["labels"] != IGNORE_INDEX
        original = torch.where(chosen, batch["labels"], batch["input_ids"])
        masked += int(chosen.sum())
        maskable += int((collator.maskable(original) & batch["attention_mask"].bool()).sum())
    return masked / max(maskable, 1)


def measured_rates(output_dir: Path) -> dict:
    """The run's held-out and first training batch's masked shares, from its batches rebuilt as the run built them
    (its config.yaml, the same seeds)."""
    config = load_run_config(output_dir / "config.yaml")
    training, data_config, _ = read_run_config(RECIPES["text-pretraining"], config)
    tokenizer = load_tokenizer(resolve_model_path(config["tokenizer"]))
    data = TextPretrainingData(RunContext(config, training, data_config, None, tokenizer, None))
    first = next(iter(data.train_batches(0, 0, 0, 1)))
    return {
        "eval_masked_share": round(masked_share(data.eval_batches(), data.collator), 4),
        "train_masked_share": round(masked_share([first], data.collator), 4),
    }


def one_run(name: str, config_name: str, steps: int, overrides: list[str], out: Path) -> dict:
    """Train ``config_name`` for ``steps`` steps into ``out``; its row (see the module docstring)."""
    sets = [
        f"training.output_dir={out}",
        f"training.max_steps={steps}",
        f"training.warmup_steps={max(1, steps // 10)}",
        "training.eval_every=0",
        "training.save_every=0",
        "training.log_every=1",
        "training.progress_bar=false",
        f"data.eval_mlm_probability={EVAL_RATE}",
        *overrides,
    ]
    config = load_run_config(config_name, sets)
    metrics = run(RECIPES["text-pretraining"], config, overwrite=True)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    step_times = [r["step_time_s"] for r in log if r["split"] == "train"][4:]
    model_section = read_model_section(config.get("model"))
    model = ARCHITECTURES[model_section["architecture"]].from_pretrained(out)
    return {
        "run": name,
        "config": f"configs/{config_name}.yaml",
        "objectives": "+".join(config["data"].get("objectives") or {"mlm": 1, "nsp": 1}),
        "optimizer": config["training"].get("optimizer", "adamw"),
        "schedule": config["training"].get("schedule", "linear"),
        "steps": metrics["step"],
        "batch_size": config["training"]["batch_size"],
        "max_seq_length": config["data"]["max_seq_length"],
        "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
        **measured_rates(out),
        "eval_mlm_accuracy": round(metrics["eval_mlm_accuracy"], 4),
        "eval_mlm_accuracy_majority_baseline": round(metrics["eval_mlm_accuracy_majority_baseline"], 4),
        "eval_mlm_loss": round(metrics["eval_mlm_loss"], 4),
        "steps_per_s": round(metrics["steps_this_run"] / metrics["train_seconds"], 3),
        "steps_per_s_median": round(1 / statistics.median(step_times), 3) if step_times else None,
        "threads": torch.get_num_threads(),
    }


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| run | objectives, optimizer, schedule | params (M) | masked: train / held-out | held-out MLM acc "
        "(majority) | steps/s (median) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['objectives']}, {r['optimizer']}, {r['schedule']} | {r['parameters_m']} | "
            f"{r['train_masked_share']:.3f} / {r['eval_masked_share']:.3f} | {r['eval_mlm_accuracy']:.4f} "
            f"({r['eval_mlm_accuracy_majority_baseline']:.4f}) | {r['steps_per_s']:.2f} ({r['steps_per_s_median']}) |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    """Run the benchmark with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit status
    (0). Errors propagate for :func:`vlbert.commands.run_tool` to report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=600, help="optimizer steps of each run (default: the default run's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="for both runs")
    p.add_argument("--workdir", help="keep the two runs here; default: a temporary directory")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.workdir or scratch)
        rows = []
        for name, config_name in RUNS:
            rows.append(one_run(name, config_name, args.steps, args.overrides, root / name))
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    return 0


__all__ = ["RUNS", "EVAL_RATE", "main", "masked_share", "measured_rates", "one_run", "table"]
