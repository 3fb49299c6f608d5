"""The command-line shape every training command (``vlbert pretrain``, ``vlbert finetune``) shares: common flags,
config loading with overrides, the run through :func:`vlbert.recipes.run`, and the final report. It sits above the
recipes (tools -> commands -> recipes -> trainer), so nothing below imports it."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from vlbert.recipes import RECIPES, run
from vlbert.recipes.report import results_table
from vlbert.training.run_config import load_run_config

COMMON_FLAGS = (
    ("init_from", "init_from"),
    ("output_dir", "training.output_dir"),
    ("max_steps", "training.max_steps"),
    ("seed", "training.seed"),
    ("log_every", "training.log_every"),
    ("save_every", "training.save_every"),
)


def training_parser(doc: str, default_config: str | None) -> argparse.ArgumentParser:
    """An argument parser with the flags of every training command; commands add their own."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--config",
        default=default_config,
        help=f"YAML run config: a file, or a shipped config's name such as vl/uniter-base "
        f"(`vlbert configs` lists them; default: {default_config})",
    )
    p.add_argument("--init-from", help="checkpoint directory or hub name to start from ('minilm': the packaged BERT)")
    p.add_argument("--output-dir", help="where checkpoints, log.jsonl and metrics.json go")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--log-every", type=int)
    p.add_argument("--save-every", type=int, help="write a resumable checkpoint every N steps")
    runs = p.add_mutually_exclusive_group()
    runs.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --output-dir")
    runs.add_argument("--overwrite", action="store_true", help="replace the run already in --output-dir")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config entry, e.g. --set training.learning_rate=5e-4",
    )
    return p


def run_from_args(args: argparse.Namespace, task: str, extra: tuple[tuple[str, Any], ...] = ()) -> dict[str, Any]:
    """Load ``args.config``, apply the flags (``extra``: more (config key, value) pairs) and ``--set``
    overrides, run the recipe ``task`` and print the final metrics as a table beside their baselines
    (:func:`vlbert.recipes.report.results_table`).

    Errors propagate with their types; :func:`vlbert.commands.errors.run_tool` turns the user's into one
    line (a run directory that holds a run, bad config values, missing data, ...) and a SIGTERM into status 143.
    Flags given on the command line (``--init-from`` aside) are passed to the recipe as ``command_line_keys``.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    flags = [
        (key, value)
        for key, value in [(key, getattr(args, name)) for name, key in COMMON_FLAGS] + list(extra)
        if value is not None
    ]  # typed values, taken as given: only --set is YAML
    config = load_run_config(args.config, list(args.set), values=flags)
    keys = tuple(key for key, _ in flags) + tuple(o.split("=", 1)[0].strip() for o in args.set)
    metrics = run(RECIPES[task], config, args.resume, args.overwrite, command_line_keys=keys)
    where = config.get("training", {}).get("output_dir")
    print(f"final metrics (every entry: {where}/metrics.json):" if where else "final metrics:")
    print(results_table(metrics))
    return metrics


__all__ = ["training_parser", "run_from_args"]
