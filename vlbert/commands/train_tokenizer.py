"""Train a WordPiece (default) or BPE vocabulary on a corpus.

    vlbert train-tokenizer --output-dir runs/tokenizer                      # BBC News, 30,000 pieces
    vlbert train-tokenizer --corpus my_docs/ --vocab-size 32000 --model bpe --output-dir runs/bpe

Use the result with pretraining: --set tokenizer=runs/tokenizer
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vlbert.commands import flag_types as flags
from vlbert.data.corpus import load_documents
from vlbert.tokenizer_training import train_tokenizer

#: The files a trained tokenizer directory holds (transformers' fast tokenizer; vocab.txt for WordPiece).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def main(argv=None) -> int:
    """Run the tool with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit
    status (0). Errors propagate for :func:`vlbert.commands.run_tool` to report.

    Raises:
        FileExistsError: ``--output-dir`` already holds a tokenizer's file (never replaced).
    """
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="bbc-news", help="bbc-news, a .txt/.jsonl file, a directory or a hub name")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--vocab-size", type=flags.count, default=30000)
    p.add_argument("--model", choices=("wordpiece", "bpe"), default="wordpiece")
    p.add_argument("--cased", action="store_true", help="keep case and accents (default: uncased, as BERT-base)")
    p.add_argument("--min-frequency", type=flags.count, default=2)
    args = p.parse_args(argv)
    output = Path(args.output_dir)
    taken = [name for name in TOKENIZER_FILES if (output / name).exists()]
    if taken:
        raise FileExistsError(
            f"{output} already holds {', '.join(taken)}; train-tokenizer never replaces a file: choose another "
            "--output-dir"
        )

    documents = load_documents(args.corpus)
    tok = train_tokenizer(documents, args.output_dir, args.vocab_size, args.model, not args.cased, args.min_frequency)
    print(f"trained a {args.model} vocabulary of {len(tok)} pieces on {len(documents)} documents -> {args.output_dir}")
    print("example:", tok.tokenize("Unbelievably, the tokenizer handles unseen words."))
    return 0
