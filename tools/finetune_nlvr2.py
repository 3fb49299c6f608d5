#!/usr/bin/env python
"""Fine-tune a (VL-pretrained) BERT for NLVR2: is a statement true of a pair of images?

    python tools/finetune_nlvr2.py --init-from runs/vl-default                  # easy-VQA image pairs
    python tools/finetune_nlvr2.py --init-from DIR --set data.dataset=nlvr2 --set data.train_file=train.json \\
        --set data.eval_file=dev.json --set data.shards=regions/
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    from vlbert.cli import run_from_args, training_parser

    p = training_parser(__doc__, str(ROOT / "configs" / "finetune" / "nlvr2-easy-vqa.yaml"))
    run_from_args(p.parse_args(argv), "nlvr2")
    return 0


if __name__ == "__main__":
    from vlbert.command_line import run_tool

    sys.exit(run_tool(main))
