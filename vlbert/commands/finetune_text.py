"""Fine-tune BERT on a text task: BBC News topic classification (embedded), a GLUE task (``datasets``' glue layout)
or your own CSV/JSON/JSONL/Parquet data.

    python tools/finetune_text.py --task bbc-news --init-from minilm --output-dir runs/bbc
    python tools/finetune_text.py --config finetune/glue-mrpc --set data.train=glue-mrpc --set data.eval=glue-mrpc
    python tools/finetune_text.py --task bbc-news --init-from minilm --output-dir runs/bbc-hf \\
        --implementation transformers
    python tools/finetune_text.py --task custom --type classification --train train.csv --eval dev.csv \\
        --set data.text_field=sentence --set data.text_pair_field=sentence2 --output-dir runs/pairs
    python tools/finetune_text.py --task custom --type tagging --train conll_train.jsonl --eval conll_dev.jsonl ...
    python tools/finetune_text.py --task custom --type qa --train squad_train.jsonl --eval squad_dev.jsonl ...
"""

from __future__ import annotations

from vlbert.cli import run_from_args, training_parser
from vlbert.data.finetuning import GLUE_TASKS


def main(argv=None) -> int:
    """Run ``vlbert finetune-text`` with ``argv`` (default config: the shipped ``finetune/bbc-news``)."""
    p = training_parser(__doc__, "finetune/bbc-news")
    p.add_argument("--task", choices=("bbc-news", "glue", "custom"))
    p.add_argument("--glue-task", choices=sorted(GLUE_TASKS), help="the GLUE task of --task glue")
    p.add_argument("--type", choices=("classification", "regression", "tagging", "qa"))
    files = ".csv/.json/.jsonl/.parquet, a save_to_disk directory or a datasets name"
    p.add_argument("--train", help=f"training data: {files}")
    p.add_argument("--eval", help=f"evaluation data: {files}")
    p.add_argument(
        "--implementation",
        choices=("vlbert", "transformers"),
        help="train transformers' model with the same recipe, for comparison",
    )
    args = p.parse_args(argv)
    run_from_args(
        args,
        "text",
        extra=(
            ("data.task", args.task),
            ("data.glue_task", args.glue_task),
            ("data.type", args.type),
            ("data.train", args.train),
            ("data.eval", args.eval),
            ("implementation", args.implementation),
        ),
    )
    return 0
