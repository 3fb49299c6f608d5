#!/usr/bin/env python
"""Fine-tune any task that has a recipe (vlbert.recipes.RECIPES): the task comes from --task or the config's
``task:`` key.

    python tools/finetune.py --config configs/finetune/snli-ve-easy-vqa.yaml --init-from runs/vl-default
    python tools/finetune.py --task vqa --config configs/finetune/vqa-easy-vqa.yaml

The task-named tools (finetune_text.py, finetune_vqa.py, finetune_retrieval.py) are this tool with their task and
default config fixed.
"""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    from vlbert.cli import run_from_args, training_parser
    from vlbert.recipes import RECIPES
    from vlbert.training.run_config import load_run_config

    p = training_parser(__doc__, None)
    p.add_argument("--task", choices=sorted(RECIPES), help="default: the config's task key")
    args = p.parse_args(argv)
    if args.config is None:
        p.error("--config is required (see configs/finetune/)")
    task = args.task or load_run_config(args.config).get("task")
    if task not in RECIPES:
        raise ValueError(f"{args.config} names task {task!r}; pass --task with one of {sorted(RECIPES)}")
    run_from_args(args, task)
    return 0


if __name__ == "__main__":
    from vlbert.command_line import run_tool

    sys.exit(run_tool(main))
