"""A text corpus tokenised once into flat on-disk arrays, for pretraining on corpora of any size.

Preparation (:func:`prepare_corpus`, automatic on first use and cached by corpus + tokenizer, or ahead of time
with ``vlbert prepare-corpus``): the documents are read with ``datasets`` (memory-mapped Arrow, never a Python
list of the corpus), split into sentences (:func:`vlbert.data.corpus.split_sentences`) and tokenised with the
fast tokenizer in ``datasets.map(batched=True, num_proc=N)``; the result is streamed into three flat files:

    tokens.bin              uint16 (vocabularies up to 65,535 ids) or uint32: every sentence's wordpieces, in order
    sentence_offsets.bin    int64 [S + 1]: sentence s is tokens[offsets[s]:offsets[s + 1]]
    document_offsets.bin    int64 [D + 1]: document d is sentences document_offsets[d] .. document_offsets[d + 1]
    token_counts.npy        int64 [vocab]: occurrences of every id (the majority-token baseline)
    meta.json               counts, dtype, the corpus and tokenizer they came from; complete.json last

:class:`TokenCorpus` reads them by position (``os.pread``): only what an item needs is read, through the page cache
that processes share, so memory does not grow with the corpus. Documents without a sentence are left out; unlike the in-memory path,
duplicate documents are kept (deduplicate the corpus beforehand at this size).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from itertools import chain
from pathlib import Path

import numpy as np

from vlbert.common.files import PositionalFiles
from vlbert.data.corpus import BBC_NEWS, hub_corpus, load_bbc_news, split_sentences

logger = logging.getLogger(__name__)

MARKER = "complete.json"
FORMAT_VERSION = 2  # part of the cache key: a change in what preparation writes never reuses older files


def corpus_dataset(source: str | os.PathLike, text_field: str = "text", split: str = "train"):
    """The corpus as a ``datasets.Dataset`` with one document per row in column ``text`` (Arrow, memory-mapped).

    Sources as :func:`vlbert.data.corpus.load_documents`: "bbc-news", a directory of ``*.txt`` files (one document
    each), a ``.txt`` file (documents separated by blank lines), a ``.jsonl``/``.json`` file (``text_field``), or a
    ``datasets`` hub name (online).

    Raises:
        FileNotFoundError: a path that does not exist and is not a hub name.
        ValueError: a JSON file or hub dataset without ``text_field``; a directory without ``.txt`` files.
    """
    import datasets

    source_str = str(source)
    if source_str == BBC_NEWS:
        return datasets.Dataset.from_dict({"text": [r["text"] for r in load_bbc_news()]})
    path = Path(source_str).expanduser()
    if path.is_dir():
        files = sorted(str(f) for f in path.rglob("*.txt"))
        if not files:
            raise ValueError(f"corpus directory {path} contains no .txt files; put one document per .txt file")
        return _local_corpus(source_str, "text", files, sample_by="document")
    if path.is_file():
        if path.suffix in (".json", ".jsonl"):
            ds = _local_corpus(source_str, "json", str(path))
        else:
            ds = _local_corpus(source_str, "text", str(path), sample_by="paragraph")
            text_field = "text"
    elif path.suffix in (".txt", ".json", ".jsonl") or os.sep in source_str:
        raise FileNotFoundError(
            f"corpus {source_str!r} does not exist; pass a .txt/.jsonl file, a directory of .txt files, or 'bbc-news'"
        )
    else:
        ds = hub_corpus(source_str, split)
    if text_field not in ds.column_names:
        raise ValueError(
            f"corpus {source_str!r} has no field {text_field!r} (fields: {ds.column_names}); set data.text_field"
        )
    return (
        ds.select_columns([text_field]).rename_column(text_field, "text")
        if text_field != "text"
        else ds.select_columns(["text"])
    )


def _local_corpus(source: str, builder: str, files: str | list[str], **options):
    """``datasets.load_dataset(builder, data_files=files, split="train", **options)``: the local corpus ``source``
    (its files ``files``) as a ``datasets.Dataset``.

    Raises:
        ValueError: a file that is not UTF-8 (named, with its first bad byte), an empty corpus, or another reading
            error of ``datasets`` (its type and message).
    """
    import datasets

    try:
        return datasets.load_dataset(builder, data_files=files, split="train", **options)
    except datasets.exceptions.DatasetGenerationError as e:
        cause = e.__cause__ or e.__context__
        if isinstance(cause, UnicodeDecodeError):
            bad, where = _first_undecodable([files] if isinstance(files, str) else files)
            raise ValueError(
                f"corpus file {bad} is not valid UTF-8 text (byte {where}); re-encode it, e.g. iconv -f latin1 -t utf-8"
            ) from None
        raise ValueError(f"could not read corpus {source!r} ({type(cause or e).__name__}: {cause or e})") from e
    except ValueError as e:
        if "corresponds to no data" in str(e):
            raise ValueError(f"corpus {source!r} is empty: it holds no document with text") from e
        raise ValueError(f"could not read corpus {source!r} ({type(e).__name__}: {e})") from e


def _first_undecodable(files, chunk: int = 1 << 22) -> tuple[str, int]:
    """The first of ``files`` that is not UTF-8, and the byte offset of its first bad byte (the error path only)."""
    import codecs

    for name in files:
        decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
        with open(name, "rb") as f:
            while True:
                block = f.read(chunk)
                try:
                    decoder.decode(block, final=not block)
                except UnicodeDecodeError as e:
                    return name, offset + e.start
                if not block:
                    break
                offset += len(block)
    return ", ".join(files), 0


def _corpus_key(source: str, text_field: str, split: str) -> str:
    """What identifies the corpus: its name, or for local paths every file's name, size and modification time."""
    path = Path(source).expanduser()
    files = sorted(path.rglob("*.txt")) if path.is_dir() else [path] if path.is_file() else []
    stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return json.dumps([FORMAT_VERSION, source, text_field, split, stats])


def tokenizer_fingerprint(tokenizer) -> str:
    """12 hex digits of the tokenizer's full definition (vocabulary, normalisation, pre-tokenisation)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    definition = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    return hashlib.sha1(definition.encode()).hexdigest()[:12]


_PLAIN_BACKENDS: dict[str, object] = {}


def _plain_backend(tokenizer):
    """A copy of the fast tokenizer's backend with padding and truncation off (a tokenizer.json may carry them,
    e.g. sentence-transformers' pad-to-128; ``tokenizer(...)`` switches them off itself, the backend does not)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    definition = backend.to_str()
    if definition not in _PLAIN_BACKENDS:
        from tokenizers import Tokenizer

        plain = Tokenizer.from_str(definition)
        plain.no_padding()
        plain.no_truncation()
        _PLAIN_BACKENDS.clear()
        _PLAIN_BACKENDS[definition] = plain
    return _PLAIN_BACKENDS[definition]


def _tokenize_batch(batch: dict, tokenizer) -> dict:

    sentences, lengths = [], []
    for text in batch["text"]:
        sents = split_sentences(text or "")
        sentences.extend(sents)
        lengths.append(len(sents))
    backend = _plain_backend(tokenizer)
    if not sentences:
        ids = []
    elif backend is not None and hasattr(backend, "encode_batch_fast"):  # the same ids, without offsets: ~2x faster
        ids = [e.ids for e in backend.encode_batch_fast(sentences, add_special_tokens=False)]
    else:
        ids = tokenizer(sentences, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False)[
            "input_ids"
        ]
    out_ids, out_lengths, pos = [], [], 0
    for n in lengths:
        doc = [s for s in ids[pos : pos + n] if s]
        pos += n
        out_ids.append(list(chain.from_iterable(doc)))
        out_lengths.append(list(map(len, doc)))
    return {"input_ids": out_ids, "sentence_lengths": out_lengths}


def prepare_corpus(
    source: str | os.PathLike,
    tokenizer,
    cache_dir: str | os.PathLike = "~/.cache/vlbert/corpora",
    text_field: str = "text",
    split: str = "train",
    num_proc: int = 1,
) -> Path:
    """Tokenise ``source`` into the memory-mapped files (module docstring), once; returns their directory
    ``cache_dir/<name>-<corpus key>-<tokenizer fingerprint>``. An interrupted preparation is redone, never used
    (``complete.json`` is written last).

    Raises:
        errors of :func:`corpus_dataset`; ValueError: the corpus has no sentence.
    """
    import fcntl

    name = Path(str(source)).name or "corpus"
    key = hashlib.sha1(_corpus_key(str(source), text_field, split).encode()).hexdigest()[:10]
    fingerprint = f"{key}-{tokenizer_fingerprint(tokenizer)}"
    directory = Path(cache_dir).expanduser() / f"{name}-{fingerprint}"
    if (directory / MARKER).is_file():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    # One process prepares; the others (ranks of one run, runs side by side) wait for it and reuse the result.
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (directory / MARKER).is_file():
                _prepare(source, tokenizer, directory, name, text_field, split, num_proc, fingerprint)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return directory


def _prepare(
    source, tokenizer, directory: Path, name: str, text_field: str, split: str, num_proc: int, fingerprint: str
) -> None:
    start = time.perf_counter()
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    ds = corpus_dataset(source, text_field, split)
    tokenized = ds.map(
        _tokenize_batch,
        batched=True,
        batch_size=256,
        num_proc=num_proc if num_proc > 1 else None,
        remove_columns=ds.column_names,
        fn_kwargs={"tokenizer": tokenizer},
        desc=f"tokenising {name}",
        # What this preparation's own directory is named by (the corpus key and the tokenizer's fingerprint):
        # without it, datasets fingerprints the map by pickling and hashing its arguments, the whole tokenizer
        # included, which took 60% of preparing a 40-article corpus.
        new_fingerprint=fingerprint,
    )
    dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max + 1 else np.uint32
    tokens_written = sentences_written = documents = 0
    counts = np.zeros(len(tokenizer), dtype=np.int64)
    with (
        open(directory / "tokens.bin", "wb") as tokens,
        open(directory / "sentence_offsets.bin", "wb") as sents,
        open(directory / "document_offsets.bin", "wb") as docs,
    ):
        sents.write(np.zeros(1, np.int64).tobytes())
        docs.write(np.zeros(1, np.int64).tobytes())
        for batch in tokenized.iter(batch_size=1000):
            arrays = []
            for ids, lengths in zip(batch["input_ids"], batch["sentence_lengths"], strict=True):
                if not lengths:
                    continue
                array = np.asarray(ids, dtype=dtype)
                arrays.append(array)
                tokens.write(array.tobytes())
                sents.write((tokens_written + np.cumsum(lengths, dtype=np.int64)).tobytes())
                tokens_written += len(ids)
                sentences_written += len(lengths)
                documents += 1
                docs.write(np.array([sentences_written], np.int64).tobytes())
            if arrays:  # one count per batch of documents, not one vocabulary-sized array per document
                counts += np.bincount(np.concatenate(arrays), minlength=len(counts))[: len(counts)]
    if sentences_written == 0:
        shutil.rmtree(directory, ignore_errors=True)
        raise ValueError(f"corpus {source!s} is empty: it holds no sentence with text")
    meta = {
        "corpus": str(source),
        "text_field": text_field,
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "vocab_size": len(tokenizer),
        "dtype": np.dtype(dtype).name,
        "tokens": tokens_written,
        "sentences": sentences_written,
        "documents": documents,
        "seconds": round(time.perf_counter() - start, 1),
        "num_proc": num_proc,
    }
    np.save(directory / "token_counts.npy", counts)
    (directory / "meta.json").write_text(json.dumps(meta, indent=1))
    (directory / MARKER).write_text("{}")
    logger.info(
        "prepared %s: %d documents, %d sentences, %d tokens in %.0f s -> %s",
        source,
        documents,
        sentences_written,
        tokens_written,
        meta["seconds"],
        directory,
    )


class TokenCorpus:
    """The prepared files of :func:`prepare_corpus`, read by position with ``os.pread``.

    Random reads go through the page cache (shared between processes and runs) without being mapped into the
    process: a memory map would count every touched page, and with large page-cache folios up to 2 MB per touch, in
    the process's resident memory, which would then grow with the corpus over a run.

    Attributes:
        meta: meta.json; num_documents: D; num_sentences: S; dtype: the token dtype.
    Raises:
        FileNotFoundError: the directory is not a complete preparation.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        if not (self.directory / MARKER).is_file():
            raise FileNotFoundError(
                f"{self.directory} is not a complete prepared corpus (no {MARKER}); prepare it "
                "with vlbert prepare-corpus or let the run do it"
            )
        self.meta = json.loads((self.directory / "meta.json").read_text())
        self.dtype = np.dtype(self.meta["dtype"])
        self.num_documents = int(self.meta["documents"])
        self.num_sentences = int(self.meta["sentences"])
        self._files = PositionalFiles()

    def _read(self, name: str, dtype, start: int, end: int) -> np.ndarray:
        size = np.dtype(dtype).itemsize
        return np.frombuffer(
            self._files.read(self.directory / f"{name}.bin", start * size, (end - start) * size), dtype=dtype
        )

    def sentences(self, document: int) -> tuple[int, int]:
        """The sentence range [first, end) of ``document``."""
        first, end = self._read("document_offsets", np.int64, document, document + 2)
        return int(first), int(end)

    def span(self, first: int, end: int) -> list[int]:
        """Wordpiece ids of sentences [first, end), concatenated."""
        a, b = self._read("sentence_offsets", np.int64, first, end + 1)[[0, -1]]
        return self._read("tokens", self.dtype, int(a), int(b)).tolist()

    def document(self, index: int) -> list[list[int]]:
        """Document ``index`` as sentences of wordpiece ids (lists, as the in-memory path has them)."""
        first, end = self.sentences(index)
        offsets = self._read("sentence_offsets", np.int64, first, end + 1)
        tokens = self._read("tokens", self.dtype, int(offsets[0]), int(offsets[-1])).tolist()
        return [
            tokens[a - offsets[0] : b - offsets[0]]
            for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)
        ]

    def token_counts(self, vocab_size: int, chunk: int = 1 << 22) -> np.ndarray:
        """int64 [vocab_size]: how often each id occurs (counted during preparation; else read in chunks)."""
        saved = self.directory / "token_counts.npy"
        if saved.is_file():
            counts = np.load(saved)
            if len(counts) >= vocab_size:
                return counts[:vocab_size]
        counts = np.zeros(vocab_size, dtype=np.int64)
        with open(self.directory / "tokens.bin", "rb") as f:
            while True:
                block = np.fromfile(f, dtype=self.meta["dtype"], count=chunk)
                if block.size == 0:
                    break
                counts += np.bincount(block, minlength=vocab_size)[:vocab_size]
        return counts

    def read_offsets(self, name: str, start: int, end: int) -> np.ndarray:
        """int64 entries [start, end) of ``sentence_offsets`` or ``document_offsets``."""
        return self._read(name, np.int64, start, end)


__all__ = ["corpus_dataset", "prepare_corpus", "TokenCorpus", "tokenizer_fingerprint"]
