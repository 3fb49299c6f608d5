"""Fine-tune BERT on a text task: BBC News topic classification (embedded) or your own CSV/JSON/JSONL data.

    python tools/finetune_text.py --task bbc-news --init-from minilm --output-dir runs/bbc
    python tools/finetune_text.py --task bbc-news --init-from minilm --output-dir runs/bbc-hf --implementation transformers
    python tools/finetune_text.py --task custom --type classification --train train.csv --eval dev.csv \\
        --set data.text_field=sentence --set data.text_pair_field=sentence2 --output-dir runs/pairs
    python tools/finetune_text.py --task custom --type tagging --train conll_train.jsonl --eval conll_dev.jsonl ...
    python tools/finetune_text.py --task custom --type qa --train squad_train.jsonl --eval squad_dev.jsonl ...
"""

from __future__ import annotations

from vlbert.cli import run_from_args, training_parser


def main(argv=None) -> int:
    """Run ``vlbert finetune-text`` with ``argv`` (default config: the shipped ``finetune/bbc-news``)."""
    p = training_parser(__doc__, "finetune/bbc-news")
    p.add_argument("--task", choices=("bbc-news", "custom"))
    p.add_argument("--type", choices=("classification", "regression", "tagging", "qa"))
    p.add_argument("--train", help="training data: .csv/.json/.jsonl or a datasets name")
    p.add_argument("--eval", help="evaluation data: .csv/.json/.jsonl or a datasets name")
    p.add_argument("--implementation", choices=("vlbert", "transformers"),
                   help="train transformers' model with the same recipe, for comparison")
    args = p.parse_args(argv)
    run_from_args(args, "text", extra=(
        ("data.task", args.task), ("data.type", args.type), ("data.train", args.train), ("data.eval", args.eval),
        ("implementation", args.implementation)))
    return 0
