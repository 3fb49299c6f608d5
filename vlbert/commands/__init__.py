"""The ``vlbert`` console command: one entry point whose subcommands are the tools (``vlbert pretrain`` is
``python tools/pretrain.py``; the scripts in ``tools/`` call the same ``main`` functions).

    vlbert --help                       # the subcommands
    vlbert pretrain --modality text     # = python tools/pretrain.py --modality text
    vlbert finetune --task vqa --init-from runs/vl-default
    vlbert benchmark inference runs/vqa-easy-vqa

This is the one implementation of vlbert's command line: ``python -m vlbert`` is this ``main``, and every script in
``tools/`` is a command here with some flags fixed (:data:`vlbert.commands.scripts.SCRIPTS`). Each subcommand's
module is imported when it is run; every subcommand runs under :func:`vlbert.commands.errors.run_tool`: a user error
is one ``error: ...`` line with exit status 2.
"""

from __future__ import annotations

import importlib
import sys
from typing import Sequence

from vlbert.commands.errors import run_tool

#: subcommand -> (module with ``main(argv)``, or ``module:function`` for another function, one line of help). A new
#: command is one module and one line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "pretrain": ("vlbert.commands.pretrain", "pretrain BERT on text (MLM + NSP) or a VL BERT on image-text pairs"),
    "finetune": ("vlbert.commands.finetune", "fine-tune a task: --task vqa|retrieval|nlvr2|snli-ve|refcoco|text"),
    "finetune-text": ("vlbert.commands.finetune:text_main", "= finetune --task text (BBC News, GLUE, your text data)"),
    "predict": ("vlbert.commands.predict", "answers, labels, boxes or matches from a trained run about images"),
    "extract": ("vlbert.commands.extract_regions", "images -> region shards (or import TSV / npz features)"),
    "convert": ("vlbert.commands.convert_checkpoint", "a published UNITER / VisualBERT / Oscar checkpoint -> a model"),
    "explain": ("vlbert.commands.explain", "fill-mask, attention, word-region pictures, generation, probes"),
    "benchmark": (
        "vlbert.commands.benchmark",
        "speed: train | inference | extraction | region-store | text-corpus | quickstart",
    ),
    "demo": ("vlbert.commands.demo", "a web page over a run: VQA, caption matching, fill-mask, attention"),
    "prepare-corpus": ("vlbert.commands.prepare_corpus", "tokenise a text corpus once into on-disk token arrays"),
    "train-tokenizer": ("vlbert.commands.train_tokenizer", "train a WordPiece (or BPE) vocabulary"),
    "configs": ("vlbert.commands.configs", "list the shipped run configs (--config takes their names)"),
    "example-image": ("vlbert.commands.example_image", "write an easy-VQA test picture to try the pipelines on"),
}


def usage() -> str:
    """The text of ``vlbert --help``: the subcommands and their one-line help."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return (
        "usage: vlbert <command> [flags]    (vlbert <command> --help for its flags)\n\ncommands:\n"
        + "\n".join(lines)
        + "\n"
    )


def command_main(name: str):
    """The ``main(argv)`` of subcommand ``name`` (its module imported now).

    Raises:
        KeyError: no such subcommand.
    """
    module, _, function = COMMANDS[name][0].partition(":")
    return getattr(importlib.import_module(module), function or "main")


def main(argv: Sequence[str] | None = None) -> int:
    """``vlbert <command> [flags]``: run the subcommand (argparse's usage rule: an unknown one is status 2)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(
            usage() + f"vlbert: error: unknown command {name!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr
        )
        return 2
    sys.argv[0] = f"vlbert {name}"  # argparse names the program after sys.argv[0] in usage lines
    return run_tool(command_main(name), rest)


__all__ = ["COMMANDS", "main", "command_main", "usage"]
