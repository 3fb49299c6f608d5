"""Fine-tune any task of the task table (:data:`vlbert.recipes.TASKS`): the task comes from --task or the config's
``task:`` key; without --config, the task's shipped easy-VQA (or BBC News) config. ``--task`` always names a task,
``--dataset`` always the task's data reader.

    vlbert finetune --task vqa --dataset easy-vqa --init-from runs/vl-default
    vlbert finetune --config configs/finetune/snli-ve-easy-vqa.yaml --init-from runs/vl-default
    vlbert finetune --config finetune/uniter-base-vqa-v2 --set data.shards=regions/mine    # a shipped config by name

Text tasks (BERT's fine-tuning: classification, regression, tagging, span QA) are ``--task text``; --dataset picks
BBC News topic classification (embedded, the default), a GLUE task or your own CSV/JSON/JSONL/Parquet data:

    vlbert finetune --task text --dataset bbc-news --init-from minilm --output-dir runs/bbc
    vlbert finetune --task text --config finetune/glue-mrpc --set data.train=glue-mrpc --set data.eval=glue-mrpc
    vlbert finetune --task text --dataset bbc-news --init-from minilm --output-dir runs/bbc-hf \\
        --implementation transformers
    vlbert finetune --task text --dataset custom --type classification --train train.csv --eval dev.csv \\
        --set data.text_field=sentence --set data.text_pair_field=sentence2 --output-dir runs/pairs
    vlbert finetune --task text --dataset custom --type tagging --train conll_train.jsonl --eval conll_dev.jsonl
    vlbert finetune --task text --dataset custom --type qa --train squad_train.jsonl --eval squad_dev.jsonl
"""

from __future__ import annotations

import argparse
from typing import Sequence

from vlbert.commands import run_from_args, training_parser
from vlbert.data.finetuning import GLUE_TASKS
from vlbert.recipes import TASKS, TaskView
from vlbert.training.run_config import load_run_config

#: The shipped config each task runs without --config (names under configs/, see vlbert.training.run_config): a
#: view of the task table.
DEFAULT_CONFIGS: TaskView = TaskView(lambda task: task.default_config)

#: Flags of the text task: (flag's dest, config key).
TEXT_FLAGS = (
    ("glue_task", "data.glue_task"),
    ("type", "data.type"),
    ("train", "data.train"),
    ("eval", "data.eval"),
    ("implementation", "implementation"),
)


def parser(doc: str = __doc__) -> argparse.ArgumentParser:
    """The ``vlbert finetune`` command line."""
    p = training_parser(doc, None)
    p.add_argument(
        "--task",
        metavar="TASK",
        help=f"the task: one of {', '.join(TASKS)} (default: the config file's task key)",
    )
    p.add_argument(
        "--dataset",
        help="the task's data reader (its config's data.dataset): e.g. easy-vqa, vqa-v2, "
        "nlvr2, karpathy; bbc-news, glue, custom",
    )
    text = p.add_argument_group("text tasks (--task text)")
    text.add_argument("--glue-task", choices=sorted(GLUE_TASKS), help="the GLUE task of --dataset glue")
    text.add_argument("--type", choices=("classification", "regression", "tagging", "qa"))
    files = ".csv/.json/.jsonl/.parquet, a save_to_disk directory or a datasets name"
    text.add_argument("--train", help=f"training data: {files}")
    text.add_argument("--eval", help=f"evaluation data: {files}")
    text.add_argument(
        "--implementation",
        choices=("vlbert", "transformers"),
        help="train transformers' model with the same recipe, for comparison",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``vlbert finetune`` with ``argv``.

    Raises:
        ValueError: neither --task nor a config naming a known task (the known tasks listed); a text task's flag
            (--type, --train, ...) with another task.
    """
    p = parser()
    args = p.parse_args(argv)
    if args.task is not None and args.task not in TASKS:
        p.error(f"argument --task: unknown task {args.task!r}; choose one of {', '.join(TASKS)}")
    if args.config is None:
        if args.task is None:
            p.error("--config or --task is required (`vlbert configs` lists the shipped configs)")
        args.config = DEFAULT_CONFIGS[args.task]
    chosen = args.task or load_run_config(args.config).get("task")
    if chosen not in TASKS:
        raise ValueError(f"{args.config} names task {chosen!r}; pass --task with one of {', '.join(TASKS)}")
    text_flags = [(key, getattr(args, dest)) for dest, key in TEXT_FLAGS]
    if chosen != "text":
        given = [dest for dest, _ in TEXT_FLAGS if getattr(args, dest) is not None]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise ValueError(f"{flag} is a flag of text tasks, not of {chosen}; leave it out or pass --task text")
        text_flags = []
    run_from_args(args, chosen, extra=(("data.dataset", args.dataset), *text_flags))
    return 0


__all__ = ["main", "parser", "DEFAULT_CONFIGS"]
