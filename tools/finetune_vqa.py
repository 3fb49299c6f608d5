#!/usr/bin/env python
"""Fine-tune a (VL-pretrained) BERT for visual question answering and report the official VQA accuracy.

    python tools/finetune_vqa.py --dataset easy-vqa --init-from runs/vl-default --output-dir runs/vqa
    python tools/finetune_vqa.py --dataset easy-vqa --init-from minilm --output-dir runs/vqa-no-vl
    python tools/finetune_vqa.py --dataset vqa-v2 --init-from DIR --output-dir runs/vqa2 \\
        --set data.train_questions=... --set data.train_annotations=... --set data.eval_questions=... \\
        --set data.eval_annotations=... --set data.shards=regions/ --set data.min_answer_count=9
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    from vlbert.cli import run_from_args, training_parser

    p = training_parser(__doc__, str(ROOT / "configs" / "finetune" / "vqa-easy-vqa.yaml"))
    p.add_argument("--dataset", choices=("easy-vqa", "vqa-v2"))
    args = p.parse_args(argv)
    run_from_args(args, "vqa", extra=(("data.dataset", args.dataset),))
    return 0


if __name__ == "__main__":
    from vlbert.command_line import run_tool

    sys.exit(run_tool(main))
