"""Fine-tune any task that has a recipe (vlbert.recipes.RECIPES): the task comes from --task or the config's
``task:`` key; without --config, the task's embedded easy-VQA (or BBC News) config.

    vlbert finetune --task vqa --dataset easy-vqa --init-from runs/vl-default
    vlbert finetune --config configs/finetune/snli-ve-easy-vqa.yaml --init-from runs/vl-default
    vlbert finetune --config finetune/uniter-base-vqa-v2 --set data.shards=regions/mine    # a shipped config by name

``python tools/finetune.py`` is the same tool; ``tools/finetune_vqa.py``, ``finetune_nlvr2.py`` and
``finetune_retrieval.py`` are it with --task fixed (:func:`task_main`).
"""

from __future__ import annotations

from typing import Sequence

from vlbert.cli import run_from_args, training_parser
from vlbert.recipes import RECIPES
from vlbert.training.run_config import load_run_config

#: The shipped config each task runs without --config (names under configs/, see vlbert.training.run_config).
DEFAULT_CONFIGS = {
    "vqa": "finetune/vqa-easy-vqa",
    "retrieval": "finetune/retrieval-easy-vqa",
    "nlvr2": "finetune/nlvr2-easy-vqa",
    "snli-ve": "finetune/snli-ve-easy-vqa",
    "refcoco": "finetune/refcoco-easy-vqa",
    "text": "finetune/bbc-news",
}


def parser(doc: str = __doc__, task: str | None = None):
    """The finetune command line; with ``task`` (an alias tool) --task defaults to it."""
    p = training_parser(doc, DEFAULT_CONFIGS.get(task) if task else None)
    p.add_argument(
        "--task",
        choices=sorted(RECIPES),
        default=task,
        help=f"the recipe (default: {task or 'the config file' + chr(39) + 's task key'})",
    )
    p.add_argument("--dataset", help="data.dataset: the task's data reader (e.g. easy-vqa, vqa-v2, nlvr2, karpathy)")
    return p


def main(argv: Sequence[str] | None = None, task: str | None = None, doc: str = __doc__) -> int:
    """Run ``vlbert finetune`` with ``argv``; ``task``: the alias tools' fixed default task.

    Raises:
        ValueError: neither --task nor a config naming a known task (the known tasks listed).
    """
    p = parser(doc, task)
    args = p.parse_args(argv)
    if args.config is None:
        if args.task not in DEFAULT_CONFIGS:
            p.error("--config or --task is required (`vlbert configs` lists the shipped configs)")
        args.config = DEFAULT_CONFIGS[args.task]
    chosen = args.task or load_run_config(args.config).get("task")
    if chosen not in RECIPES:
        raise ValueError(f"{args.config} names task {chosen!r}; pass --task with one of {sorted(RECIPES)}")
    run_from_args(args, chosen, extra=(("data.dataset", args.dataset),))
    return 0


def task_main(task: str, doc: str):
    """The ``main(argv)`` of an alias tool (tools/finetune_vqa.py ...): this tool with --task ``task``."""

    def alias(argv: Sequence[str] | None = None) -> int:
        return main(argv, task=task, doc=doc)

    return alias


__all__ = ["main", "task_main", "parser", "DEFAULT_CONFIGS"]
