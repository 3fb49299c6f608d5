"""vlbert's speed benchmarks, one tool with subcommands, kept in the repository beside the library (as OpenCLIP and
timm keep theirs): ``benchmarks/`` is not part of the ``vlbert`` wheel. From a clone's root:

    python -m benchmarks train [--bf16] [--device cuda] [--trainer]   # train step vs transformers (default)
    python -m benchmarks inference runs/vqa-easy-vqa --images 256      # images/s of VQA from files
    python -m benchmarks extraction --images 8                          # extraction, every backend side by side
    python -m benchmarks region-store --images 5000 50000               # peak RSS vs the region store's size
    python -m benchmarks text-corpus --copies 2 200                     # text pretraining on ~10 MB and ~1 GB
    python -m benchmarks visual-backbone --steps 300                    # trainable vs frozen backbone in the model
    python -m benchmarks quickstart --repeats 3                         # the README's quick start, clean, timed
    python -m benchmarks text-encoders --steps 600                      # BERT vs ModernBERT at the default budget
    python -m benchmarks text-encoder-roofline                          # their base sizes' predicted H100 step
    python -m benchmarks memory --config text/bert-base-128 --batch-size 32  # peak GPU memory, largest batch
    python -m benchmarks retrieval --images 1000 5000                   # shortlist vs full re-rank: time, R@K
    python -m benchmarks itc-vs-itm --steps 200 --seeds 0 1 2          # ITC + ITM vs ITM alone: retrieval R@1
    python -m benchmarks text-then-vision --cache-dir runs/ttv          # each pretraining stage's easy-VQA gain

Without a subcommand the train-step benchmark runs (``python tools/benchmark.py --bf16`` as before); the scripts
``tools/benchmark_inference.py`` ... run their subcommand (:func:`run_script`), and in a checkout ``vlbert benchmark
...`` runs ``python -m benchmarks ...`` in a child process (:mod:`vlbert.commands.benchmark`). Every benchmark runs
under vlbert's error rule (:func:`vlbert.commands.run_tool`): a user error is one ``error: ...`` line, status 2.
This package imports vlbert; vlbert never imports it (tests/layers/test_layers.py).
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Sequence

from benchmarks import (
    extraction,
    inference,
    itc_vs_itm,
    memory,
    quickstart,
    region_store,
    retrieval,
    text_corpus,
    text_encoder_roofline,
    text_encoders,
    text_then_vision,
    train,
    visual_backbone,
)
from vlbert.commands import run_tool

#: subcommand -> its module (each has ``main(argv)`` and a module docstring).
BENCHMARKS = {
    "train": train,
    "inference": inference,
    "extraction": extraction,
    "region-store": region_store,
    "text-corpus": text_corpus,
    "visual-backbone": visual_backbone,
    "quickstart": quickstart,
    "text-encoders": text_encoders,
    "text-encoder-roofline": text_encoder_roofline,
    "memory": memory,
    "retrieval": retrieval,
    "itc-vs-itm": itc_vs_itm,
    "text-then-vision": text_then_vision,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m benchmarks [<what>] [flags]``: ``<what>`` one of :data:`BENCHMARKS`, default ``train``.

    Raises:
        ValueError: a first word that names no benchmark (the closest named), instead of running another.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in (["-h"], ["--help"]):
        print(
            f"usage: python -m benchmarks [{'|'.join(BENCHMARKS)}] [flags]   (--help after one for its flags)\n\n"
            + __doc__.strip()
        )
        return 0
    if argv and argv[0] in BENCHMARKS:
        return BENCHMARKS[argv[0]].main(argv[1:])
    if argv and not argv[0].startswith("-"):  # a misspelt subcommand: not the train-step benchmark's flags
        close = difflib.get_close_matches(argv[0], list(BENCHMARKS), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ValueError(f"unknown benchmark {argv[0]!r}; {hint}the benchmarks are {', '.join(BENCHMARKS)}")
    return train.main(argv)


def script_arguments(path: str) -> list[str]:
    """The fixed arguments of the script ``tools/<name>.py`` at ``path``: ``tools/benchmark.py`` none (the train-step
    benchmark), ``tools/benchmark_<what>.py`` the subcommand ``<what>`` (underscores as dashes).

    Raises:
        KeyError: ``path`` names no benchmark script.
    """
    stem = Path(path).stem
    if stem == "benchmark":
        return []
    name = stem.removeprefix("benchmark_").replace("_", "-")
    if not stem.startswith("benchmark_") or name not in BENCHMARKS:
        raise KeyError(f"{path} is not a benchmark script")
    return [name]


def run_script(path: str) -> int:
    """Run the benchmark script at ``path`` (a ``tools/benchmark*.py`` file's ``__file__``) with ``sys.argv`` under
    the error rule: ``python -m benchmarks <its subcommand> <sys.argv[1:]>``; returns the exit status."""
    return run_tool(main, [*script_arguments(path), *sys.argv[1:]])


__all__ = ["BENCHMARKS", "main", "script_arguments", "run_script"]
