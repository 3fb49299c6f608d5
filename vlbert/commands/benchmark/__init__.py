"""``vlbert benchmark <what>``: the speed benchmarks as one tool with subcommands.

    vlbert benchmark train [--bf16] [--device cuda] [--trainer]   # train step vs transformers (default)
    vlbert benchmark inference runs/vqa-easy-vqa --images 256      # images/s of VQA from files
    vlbert benchmark extraction --images 8                          # region extraction, every backend side by side
    vlbert benchmark region-store --images 5000 50000               # peak RSS vs the region store's size
    vlbert benchmark text-corpus --copies 2 200                     # text pretraining on ~10 MB and ~1 GB
    vlbert benchmark visual-backbone --steps 300                    # trainable vs frozen backbone in the model
    vlbert benchmark quickstart --repeats 3                         # the README's quick start, clean, timed

Without a subcommand the train-step benchmark runs (``python tools/benchmark.py --bf16`` as before); the old
scripts ``tools/benchmark_inference.py`` ... run their subcommand.
"""

from __future__ import annotations

import sys
from typing import Sequence

from vlbert.commands.benchmark import (
    extraction,
    inference,
    quickstart,
    region_store,
    text_corpus,
    train,
    visual_backbone,
)

#: subcommand -> its module (each has ``main(argv)`` and a module docstring).
BENCHMARKS = {
    "train": train,
    "inference": inference,
    "extraction": extraction,
    "region-store": region_store,
    "text-corpus": text_corpus,
    "visual-backbone": visual_backbone,
    "quickstart": quickstart,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``vlbert benchmark [<what>] [flags]``: ``<what>`` one of :data:`BENCHMARKS`, default ``train``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in (["-h"], ["--help"]):
        print(
            f"usage: vlbert benchmark [{'|'.join(BENCHMARKS)}] [flags]   (--help after one for its flags)\n\n"
            + __doc__.strip()
        )
        return 0
    if argv and argv[0] in BENCHMARKS:
        return BENCHMARKS[argv[0]].main(argv[1:])
    return train.main(argv)


__all__ = ["BENCHMARKS", "main"]
