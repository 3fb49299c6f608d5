"""Tokenise a text corpus once into on-disk token arrays (vlbert/data/token_corpus.py), ahead of a text
pretraining run on it (the run prepares it itself otherwise; both use the same cache).

    vlbert prepare-corpus --corpus wiki_dir/ --num-proc 8
    vlbert prepare-corpus --corpus books.jsonl --text-field text --tokenizer bert-base-uncased

Prints the prepared directory, its counts and the throughput in MB of text per second.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from vlbert.data.token_corpus import TokenCorpus, prepare_corpus
from vlbert.tokenization import load_tokenizer, resolve_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def corpus_bytes(source: str) -> int:
    """Size of a local corpus in bytes (0 for hub names and bbc-news)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*.txt"))
    return path.stat().st_size if path.is_file() else 0


def main(argv=None) -> int:
    """Run the tool with ``argv`` (default: ``sys.argv[1:]``; see the module docstring); returns the exit
    status (0). Errors propagate for :func:`vlbert.commands.run_tool` to report."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, help="bbc-news, a .txt/.jsonl file, a directory of .txt, or a hub name")
    p.add_argument("--tokenizer", default="minilm", help="a directory, hub name or alias (default: minilm)")
    p.add_argument("--text-field", default="text")
    p.add_argument("--split", default="train")
    p.add_argument("--num-proc", type=int, default=1)
    p.add_argument("--cache-dir", default="~/.cache/vlbert/corpora")
    args = p.parse_args(argv)

    tokenizer = load_tokenizer(resolve_model_path(args.tokenizer))
    start = time.perf_counter()
    directory = prepare_corpus(args.corpus, tokenizer, args.cache_dir, args.text_field, args.split, args.num_proc)
    seconds = time.perf_counter() - start
    meta = TokenCorpus(directory).meta
    size = corpus_bytes(args.corpus)
    print(
        json.dumps(
            {
                "directory": str(directory),
                **{k: meta[k] for k in ("documents", "sentences", "tokens")},
                "seconds": round(seconds, 1),
                "num_proc": args.num_proc,
                "mb_per_s": round(size / 1e6 / seconds, 2) if size else None,
            }
        )
    )
    return 0
