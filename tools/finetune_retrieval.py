#!/usr/bin/env python
"""Fine-tune for image-text retrieval; report Recall@1/5/10 (image->text, text->image).

    python tools/finetune_retrieval.py --init-from runs/vl-default --output-dir runs/retrieval
    python tools/finetune_retrieval.py --init-from DIR --output-dir runs/coco --set data.dataset=karpathy \\
        --set data.captions_file=dataset_coco.json --set data.shards=coco_regions/ --set data.image_id_format={cocoid}
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "finetune" / "retrieval-easy-vqa.yaml"))
    p.add_argument("--init-from", help="checkpoint directory (VL-pretrained or any BERT), or 'minilm'")
    p.add_argument("--output-dir")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from vlbert.training.retrieval_finetuning import run_retrieval_finetuning
    from vlbert.training.run_config import load_run_config

    overrides = [f"{k}={v}" for k, v in (("init_from", args.init_from), ("training.output_dir", args.output_dir),
                                          ("training.max_steps", args.max_steps), ("training.seed", args.seed))
                 if v is not None] + args.set
    metrics = run_retrieval_finetuning(load_run_config(args.config, overrides), resume=args.resume)
    print("final metrics:", {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
