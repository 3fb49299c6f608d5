"""The ``vlbert`` console command: one entry point whose subcommands are the tools (``vlbert pretrain`` is
``python tools/pretrain.py``; the scripts in ``tools/`` call the same ``main`` functions).

    vlbert --help                       # the subcommands
    vlbert pretrain --modality text     # = python tools/pretrain.py --modality text
    vlbert finetune --task vqa --init-from runs/vl-default
    vlbert benchmark inference runs/vqa-easy-vqa   # in a clone: python -m benchmarks inference (benchmarks/)

This is the one implementation of vlbert's command line: ``python -m vlbert`` is this ``main``, and every script in
``tools/`` but the benchmark scripts (which run the repository's ``benchmarks/``, not part of vlbert) is a command
here with some flags fixed (:data:`vlbert.commands.scripts.SCRIPTS`). Each subcommand's module is imported when it
is run; every subcommand runs under :func:`run_tool`: a user error is one ``error: ...`` line with exit status 2.

The training commands (``pretrain``, ``finetune``) share one shape, defined here: common flags
(:func:`training_parser`), config loading with overrides, the run through :func:`vlbert.recipes.run` and the final
report (:func:`run_from_args`). This package sits above the recipes (tools -> commands -> recipes -> trainer), so
nothing below imports it.

Errors: the one rule every ``vlbert`` command (and so every script in ``tools/``) follows, as argparse does for its
flags: an error in what the user supplied (config files and values, flags, data files and their records,
checkpoints, shards, images) is printed as one line, ``error: <what is wrong and the fix>``, with exit status 2; a
traceback means a bug in vlbert.

Library callers keep the exception types (``ValueError``, ``FileNotFoundError``, ``RegionError``, ...): only
:func:`run_tool` turns them into lines. Which exceptions are the user's:

* ``ValueError`` and its subclasses (``RegionError``, ``ShardError``, ``ImageDecodeError``), ``OSError`` and its
  subclasses (``FileNotFoundError``, ``RunExistsError``) and ``ModuleNotFoundError`` raised by vlbert's own code
  (``vlbert/``, ``detectors/``, ``tools/``, a checkout's ``benchmarks/``): vlbert raises these only after checking
  what it was given, with a message that names the input; the same types raised deep inside torch or numpy are not
  checked input, so they keep their traceback;
* an ``OSError`` about a named file (``FileNotFoundError``, ``IsADirectoryError``, ``PermissionError``, ... with a
  ``filename``), wherever it is raised: the message names the file.

A diverged run (:class:`~vlbert.training.trainer.NonFiniteLossError`) and processes that cannot agree or reach
each other (:class:`~vlbert.training.processes.ProcessGroupError`) are one line too, with exit status 1, and a
preempted one (SIGTERM) exits with 143 after its checkpoint. ``VLBERT_TRACEBACK=1`` shows every traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from vlbert.recipes import TASKS, run
from vlbert.recipes.report import results_table
from vlbert.training.processes import ProcessGroupError
from vlbert.training.run_config import load_run_config
from vlbert.training.trainer import NonFiniteLossError, TrainingPreempted

#: The directories whose code raises checked-input errors on purpose.
_OWN_CODE = tuple(
    str(Path(__file__).resolve().parents[2] / name) + os.sep for name in ("vlbert", "detectors", "tools", "benchmarks")
)
USAGE_ERROR = 2
FAILED_RUN = 1
PREEMPTED = 143


def _raised_by_vlbert(error: BaseException) -> bool:
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(_OWN_CODE)


def is_user_error(error: BaseException) -> bool:
    """Whether ``error`` reports a problem with what the user supplied (see the module docstring)."""
    if isinstance(error, OSError) and error.filename is not None:
        return True
    return isinstance(error, (ValueError, OSError, ModuleNotFoundError)) and _raised_by_vlbert(error)


def one_line(error: BaseException) -> str:
    """``error``'s message on one line (newlines joined with "; ", an ``OSError``'s errno text and file kept)."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        text = f"{error.filename}: {error.strerror}"
    else:
        text = str(error) or type(error).__name__
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())


def _report(kind: str, error: BaseException) -> None:
    """Close progress bars still open (so the message starts its own line), then print ``kind: message``."""
    try:
        from tqdm import tqdm

        for bar in list(getattr(tqdm, "_instances", ())):
            bar.close()
    except ImportError:  # pragma: no cover - tqdm is a dependency
        pass
    sys.stderr.flush()
    print(f"{kind}: {one_line(error)}", file=sys.stderr)


def run_tool(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> int:
    """Run a command's ``main(argv)`` under the error rule (:func:`main` runs every command so); returns the exit
    status (0, 1, 2 or 143).

    Prints ``error: ...`` on standard error for a user error (status 2) or a diverged run (status 1). Any other
    exception propagates with its traceback. ``SystemExit`` (argparse, ``--help``) passes through.
    """
    show_traceback = os.environ.get("VLBERT_TRACEBACK", "") not in ("", "0")
    try:
        return main(argv) or 0
    except TrainingPreempted as e:
        _report("warning", e)
        return PREEMPTED
    except (NonFiniteLossError, ProcessGroupError) as e:
        if show_traceback:
            raise
        _report("error", e)
        return FAILED_RUN
    except Exception as e:
        if show_traceback or not is_user_error(e):
            raise
        _report("error", e)
        return USAGE_ERROR


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

    Errors propagate with their types; :func:`vlbert.commands.run_tool` turns the user's into one
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
    metrics = run(TASKS[task].recipe, config, args.resume, args.overwrite, command_line_keys=keys)
    where = config.get("training", {}).get("output_dir")
    print(f"final metrics (every entry: {where}/metrics.json):" if where else "final metrics:")
    print(results_table(metrics))
    return metrics


#: subcommand -> (module with ``main(argv)``, one line of help). A new command is one module and one line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "pretrain": ("vlbert.commands.pretrain", "pretrain BERT on text (MLM + NSP) or a VL BERT on image-text pairs"),
    "finetune": ("vlbert.commands.finetune", "fine-tune a task: --task vqa|retrieval|nlvr2|snli-ve|refcoco|text"),
    "predict": ("vlbert.commands.predict", "answers, labels, boxes or matches from a trained run about images"),
    "extract": ("vlbert.commands.extract_regions", "images -> region shards (or import TSV / npz features)"),
    "convert": ("vlbert.commands.convert_checkpoint", "a published UNITER / VisualBERT / Oscar checkpoint -> a model"),
    "explain": ("vlbert.commands.explain", "fill-mask, attention, word-region pictures, generation, probes"),
    "benchmark": (
        "vlbert.commands.benchmark",
        "in a clone, python -m benchmarks: train | inference | extraction | region-store | text-corpus | ...",
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
    return importlib.import_module(COMMANDS[name][0]).main


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


__all__ = [
    "COMMANDS",
    "main",
    "command_main",
    "usage",
    "training_parser",
    "run_from_args",
    "run_tool",
    "is_user_error",
    "one_line",
    "USAGE_ERROR",
    "FAILED_RUN",
    "PREEMPTED",
]
