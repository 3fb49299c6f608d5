#!/usr/bin/env python
"""Fine-tune BERT on a text task: BBC News topic classification (embedded) or your own CSV/JSON/JSONL data.

    python tools/finetune_text.py --task bbc-news --init-from minilm --output-dir runs/bbc
    python tools/finetune_text.py --task bbc-news --init-from minilm --output-dir runs/bbc-hf --implementation transformers
    python tools/finetune_text.py --task custom --type classification --train train.csv --eval dev.csv \\
        --set data.text_field=sentence --set data.text_pair_field=sentence2 --output-dir runs/pairs
    python tools/finetune_text.py --task custom --type tagging --train conll_train.jsonl --eval conll_dev.jsonl ...
    python tools/finetune_text.py --task custom --type qa --train squad_train.jsonl --eval squad_dev.jsonl ...
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "finetune" / "bbc-news.yaml"))
    p.add_argument("--task", choices=("bbc-news", "custom"))
    p.add_argument("--type", choices=("classification", "regression", "tagging", "qa"))
    p.add_argument("--train", help="training data: .csv/.json/.jsonl or a datasets name")
    p.add_argument("--eval", help="evaluation data: .csv/.json/.jsonl or a datasets name")
    p.add_argument("--init-from", help="checkpoint directory or hub name, or 'minilm' (the packaged BERT)")
    p.add_argument("--output-dir")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--implementation", choices=("vlbert", "transformers"),
                   help="train transformers' model with the same recipe, for comparison")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from vlbert.training.run_config import load_run_config
    from vlbert.training.text_finetuning import run_text_finetuning

    flags = (("data.task", args.task), ("data.type", args.type), ("data.train", args.train),
             ("data.eval", args.eval), ("init_from", args.init_from), ("training.output_dir", args.output_dir),
             ("training.max_steps", args.max_steps), ("training.seed", args.seed),
             ("implementation", args.implementation))
    overrides = [f"{k}={v}" for k, v in flags if v is not None] + args.set
    metrics = run_text_finetuning(load_run_config(args.config, overrides), resume=args.resume)
    print("final metrics:", {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
