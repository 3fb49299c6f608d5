#!/usr/bin/env python
"""Pretrain BERT on text (MLM + NSP) or a vision-language BERT on image-text pairs.

    python tools/pretrain.py --modality text                 # embedded default: small BERT on BBC News
    python tools/pretrain.py --modality text --config configs/text/bert-base-128.yaml --set data.corpus=my.txt
    python tools/pretrain.py --modality text --output-dir runs/x --save-every 100 --resume

Every flag overrides the config file; --set section.key=value overrides any other entry.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIGS = {"text": ROOT / "configs" / "text" / "default.yaml", "vl": ROOT / "configs" / "vl" / "default.yaml"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modality", choices=("text", "vl"), default="text")
    p.add_argument("--config", help="YAML run config (default: configs/<modality>/default.yaml)")
    p.add_argument("--output-dir", help="where checkpoints, log.jsonl and metrics.json go")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--init-from", help="BERT checkpoint directory or hub name to start from")
    p.add_argument("--seed", type=int)
    p.add_argument("--log-every", type=int)
    p.add_argument("--save-every", type=int, help="write a resumable checkpoint every N steps")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --output-dir")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config entry, e.g. --set training.learning_rate=5e-4")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from vlbert.training.run_config import load_run_config

    overrides = list(args.set)
    for flag, key in (("output_dir", "training.output_dir"), ("max_steps", "training.max_steps"),
                      ("seed", "training.seed"), ("log_every", "training.log_every"),
                      ("save_every", "training.save_every"), ("init_from", "init_from")):
        value = getattr(args, flag)
        if value is not None:
            overrides.insert(0, f"{key}={value}")
    config = load_run_config(args.config or DEFAULT_CONFIGS[args.modality], overrides)
    config.setdefault("modality", args.modality)
    if config["modality"] != args.modality:
        raise SystemExit(f"--modality {args.modality} but the config says modality: {config['modality']}")
    if args.modality == "text":
        from vlbert.training.text_pretraining import run_text_pretraining as run
    else:
        from vlbert.training.vl_pretraining import run_vl_pretraining as run
    metrics = run(config, resume=args.resume)
    summary = {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}
    print("final metrics:", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
