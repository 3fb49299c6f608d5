#!/usr/bin/env python
"""Fine-tune for image-text retrieval; report Recall@1/5/10 (image->text, text->image).

    python tools/finetune_retrieval.py --init-from runs/vl-default --output-dir runs/retrieval
    python tools/finetune_retrieval.py --init-from DIR --output-dir runs/coco --set data.dataset=karpathy \\
        --set data.captions_file=dataset_coco.json --set data.shards=coco_regions/ --set data.image_id_format={cocoid}
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    from vlbert.cli import run_from_args, training_parser

    p = training_parser(__doc__, str(ROOT / "configs" / "finetune" / "retrieval-easy-vqa.yaml"))
    run_from_args(p.parse_args(argv), "retrieval")
    return 0


if __name__ == "__main__":
    from vlbert.command_line import run_tool

    sys.exit(run_tool(main))
