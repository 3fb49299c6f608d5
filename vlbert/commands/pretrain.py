"""Pretrain BERT on text (MLM + NSP) or a vision-language BERT on image-text pairs (MLM, MRFR, MRC, ITM).

    vlbert pretrain --modality text                 # embedded default: small BERT on BBC News
    vlbert pretrain --modality vl                   # embedded default: MiniLM + regions on easy-VQA
    vlbert pretrain --modality text --config configs/text/bert-base-128.yaml --set data.corpus=my.txt
    vlbert pretrain --modality text --output-dir runs/x --save-every 100 --resume

Every flag overrides the config file; --set section.key=value overrides any other entry.
"""

from __future__ import annotations

from vlbert.commands import run_from_args, training_parser
from vlbert.recipes import TASKS
from vlbert.training.run_config import load_run_config


def main(argv=None) -> int:
    """Run ``vlbert pretrain`` with ``argv`` (the default config: the shipped ``<modality>/default``).

    Raises:
        ValueError: the config is written for the other modality.
    """
    p = training_parser(__doc__, "configs/<modality>/default.yaml")
    p.add_argument("--modality", choices=("text", "vl"), default="text")
    args = p.parse_args(argv)
    task = TASKS[f"{args.modality}-pretraining"]
    if args.config == "configs/<modality>/default.yaml":
        args.config = task.default_config  # a shipped config, by name

    written_for = load_run_config(args.config).get("modality", args.modality)
    if written_for != args.modality:
        raise ValueError(
            f"--modality {args.modality}, but {args.config} is a {written_for} config; "
            f"pass --modality {written_for} or a {args.modality} config"
        )
    run_from_args(args, task.name)
    return 0
