"""The scripts in ``tools/``: each is a ``vlbert`` command with some flags fixed, run through
:func:`vlbert.commands.main` (so the same parsing and the same one-line error rule).

    python tools/pretrain.py --modality text      = vlbert pretrain --modality text
    python tools/finetune_vqa.py --init-from DIR  = vlbert finetune --task vqa --init-from DIR

The task scripts (``finetune_vqa`` ...) come from the task table (:attr:`vlbert.recipes.Task.script`); a flag the
user gives after the fixed ones wins (argparse keeps the last). The benchmark scripts (``tools/benchmark*.py``) run
the repository's ``benchmarks`` package instead (:func:`benchmarks.run_script`), which is not part of vlbert.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Sequence

from vlbert.commands import command_main, main
from vlbert.recipes import TASKS

#: tools/<name>.py -> the ``vlbert`` arguments it stands for.
SCRIPTS: dict[str, tuple[str, ...]] = {
    "pretrain": ("pretrain",),
    "finetune": ("finetune",),
    "predict": ("predict",),
    "extract_regions": ("extract",),
    "convert_checkpoint": ("convert",),
    "explain": ("explain",),
    "prepare_corpus": ("prepare-corpus",),
    "train_tokenizer": ("train-tokenizer",),
    **{task.script: task.command_line for task in TASKS.values() if task.script},
}


def script_main(name: str) -> Callable[[Sequence[str] | None], int | None]:
    """The ``main(argv)`` of ``tools/<name>.py`` without the error rule (exceptions keep their types): its
    command's ``main`` with the script's fixed flags first.

    Raises:
        KeyError: no such script.
    """
    command, *fixed = SCRIPTS[name]
    run = command_main(command)
    return lambda argv=None: run([*fixed, *(sys.argv[1:] if argv is None else argv)])


def run_script(path: str) -> int:
    """Run the script at ``path`` (a ``tools/*.py`` file's ``__file__``) with ``sys.argv``: ``vlbert <its command>
    <fixed flags> <sys.argv[1:]>``; returns the exit status (:func:`vlbert.commands.main`)."""
    return main([*SCRIPTS[Path(path).stem], *sys.argv[1:]])


__all__ = ["SCRIPTS", "script_main", "run_script"]
