#!/usr/bin/env python
"""Fine-tune a (VL-pretrained) BERT for visual question answering and report the official VQA accuracy.

    python tools/finetune_vqa.py --dataset easy-vqa --init-from runs/vl-default --output-dir runs/vqa
    python tools/finetune_vqa.py --dataset easy-vqa --init-from minilm --output-dir runs/vqa-no-vl
    python tools/finetune_vqa.py --dataset vqa-v2 --init-from DIR --output-dir runs/vqa2 \\
        --set data.train_questions=... --set data.train_annotations=... --set data.eval_questions=... \\
        --set data.eval_annotations=... --set data.shards=regions/ --set data.min_answer_count=9
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "finetune" / "vqa-easy-vqa.yaml"))
    p.add_argument("--dataset", choices=("easy-vqa", "vqa-v2"))
    p.add_argument("--init-from", help="checkpoint directory (VL-pretrained or any BERT), or 'minilm'")
    p.add_argument("--output-dir")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from vlbert.training.run_config import load_run_config
    from vlbert.training.vqa_finetuning import run_vqa_finetuning

    overrides = [f"{k}={v}" for k, v in (("data.dataset", args.dataset), ("init_from", args.init_from),
                                          ("training.output_dir", args.output_dir),
                                          ("training.max_steps", args.max_steps), ("training.seed", args.seed))
                 if v is not None] + args.set
    metrics = run_vqa_finetuning(load_run_config(args.config, overrides), resume=args.resume)
    print("final metrics:", {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
