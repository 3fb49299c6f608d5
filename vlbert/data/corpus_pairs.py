"""BERT's segment pairs drawn at load time from a prepared on-disk corpus (:class:`vlbert.data.token_corpus.TokenCorpus`).

BERT's construction (section 3.1, appendix A.1; google-research/bert ``create_pretraining_data.py``), split in two
so that nothing grows with the corpus in memory:

* once per (documents, length, short_seq_prob, seed), a sample index is built and cached on disk beside the corpus
  (``samples-*.rows``, read by position, and ``samples-*.lengths``): each document's sentences are cut into chunks that
  fill a target length (shorter, drawn in [2, max], with probability ``short_seq_prob``); a row is (document, first
  sentence, end sentence, target);
* at load time, item i of epoch e draws from a generator seeded by (seed, e, i): where A ends inside the chunk,
  whether B is the true continuation or a span of another document (50/50; a one-sentence chunk takes the next
  sentence as its true B), the random document and its starting sentence, and the truncation.

Differences from the reference, which builds every pair in memory: the chunks are fixed across epochs (the A/B
split, the NSP choice and the random B are redrawn every epoch), and when B is random the chunk's unused sentences
are not carried into the next chunk.
"""

from __future__ import annotations

import hashlib
import os
import random
import zlib
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from vlbert.common.files import PositionalFiles
from vlbert.data.pretraining import IS_NEXT, IS_RANDOM, truncate_pair
from vlbert.data.token_corpus import TokenCorpus


def split_documents(num_documents: int, eval_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) document indices: document d is held out when a hash of (seed, d) falls under
    ``eval_fraction`` (whole documents; no list of the corpus is shuffled in memory).

    Raises:
        ValueError: ``eval_fraction`` outside [0, 1).
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    threshold = int(eval_fraction * 2**32)
    held = np.fromiter(
        (zlib.crc32(f"{seed}-{d}".encode()) < threshold for d in range(num_documents)), dtype=bool, count=num_documents
    )
    return np.flatnonzero(~held), np.flatnonzero(held)


def build_sample_index(
    corpus: TokenCorpus,
    documents: np.ndarray,
    max_tokens: int,
    short_seq_prob: float,
    seed: int,
    rows_file,
    lengths_file,
    block: int = 4096,
) -> int:
    """Write the chunks of ``documents`` (ascending indices; module docstring) as int64 rows (document, first sentence, end sentence, target length) to
    ``rows_file`` and their token counts + 3, capped at 65,535, as uint16 to ``lengths_file``; documents are read
    ``block`` at a time, so memory stays bounded whatever the corpus. Returns the number of rows."""
    rng = random.Random(f"chunks-{seed}")
    written = 0
    for b in range(0, len(documents), block):
        docs = documents[b : b + block]  # ascending document indices
        d_lo, d_hi = int(docs[0]), int(docs[-1])
        doc_offsets = corpus.read_offsets("document_offsets", d_lo, d_hi + 2)
        s_lo = int(doc_offsets[0])
        sent_offsets = corpus.read_offsets("sentence_offsets", s_lo, int(doc_offsets[-1]) + 1)
        rows, lengths = [], []
        for d in docs:
            d = int(d)
            first, end = int(doc_offsets[d - d_lo]), int(doc_offsets[d - d_lo + 1])
            sizes = np.diff(sent_offsets[first - s_lo : end - s_lo + 1])
            target = max_tokens if rng.random() >= short_seq_prob else rng.randint(2, max_tokens)
            start, length = first, 0
            for k, n in enumerate(sizes.tolist()):
                length += n
                s = first + k
                if s == end - 1 or length >= target:
                    rows.append((d, start, s + 1, target))
                    lengths.append(min(length + 3, 65535))
                    start, length = s + 1, 0
                    target = max_tokens if rng.random() >= short_seq_prob else rng.randint(2, max_tokens)
        rows_file.write(np.asarray(rows, dtype=np.int64).reshape(-1, 4).tobytes())
        lengths_file.write(np.asarray(lengths, dtype=np.uint16).tobytes())
        written += len(rows)
    return written


class CorpusPairsDataset(Dataset):
    """NSP + MLM pairs from a :class:`TokenCorpus` (module docstring). Each item is a dict: ``input_ids``,
    ``token_type_ids`` (lists of int, ``[CLS] A [SEP] B [SEP]``), ``next_sentence_label`` (0 = B follows A) and
    ``mask_seed`` (the seed :class:`vlbert.data.pretraining.MaskingCollator` draws the item's masking from).

    Args:
        corpus: the prepared corpus.
        documents: the document indices to draw from (train or held out, :func:`split_documents`).
        tokenizer: for [CLS] / [SEP].
        max_seq_length: wordpieces per pair including the three special tokens.
        short_seq_prob: BERT's 0.1.
        seed: randomness of the chunks, pairs and masking.
        cache_name: the sample index is cached as ``samples-<name>-<key>.npy`` in the corpus directory.
        random_next: draw B from another document half the time (NSP's negatives); False: B always follows A
            (``next_sentence_label`` always 0; RoBERTa without NSP, ALBERT's SOP swaps the pair itself).
    Raises:
        ValueError: ``max_seq_length`` < 5, or no chunk (no document).
    """

    def __init__(
        self,
        corpus: TokenCorpus,
        documents: np.ndarray,
        tokenizer,
        max_seq_length: int = 128,
        short_seq_prob: float = 0.1,
        seed: int = 0,
        cache_name: str = "train",
        random_next: bool = True,
    ):
        if max_seq_length < 5:
            raise ValueError(f"max_seq_length must be at least 5 to hold [CLS] A [SEP] B [SEP], got {max_seq_length}")
        self.corpus, self.documents = corpus, np.sort(np.asarray(documents, dtype=np.int64))
        self.max_seq_length, self.max_tokens = max_seq_length, max_seq_length - 3
        self.seed, self.epoch, self.random_next = seed, 0, random_next
        self.cls_id, self.sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        key = hashlib.sha1(self.documents.tobytes() + f"{max_seq_length}-{short_seq_prob}-{seed}".encode()).hexdigest()[
            :10
        ]
        stem = Path(corpus.directory) / f"samples-{cache_name}-{key}"
        rows_path, lengths_path = stem.with_suffix(".rows"), stem.with_suffix(".lengths")
        if not (rows_path.is_file() and lengths_path.is_file()):
            tmp = [p.with_name(f"{p.name}.{os.getpid()}.tmp") for p in (rows_path, lengths_path)]  # ranks may race
            with open(tmp[0], "wb") as rows, open(tmp[1], "wb") as lengths:
                build_sample_index(corpus, self.documents, self.max_tokens, short_seq_prob, seed, rows, lengths)
            tmp[1].replace(lengths_path)
            tmp[0].replace(rows_path)
        self.lengths_path = lengths_path
        count = lengths_path.stat().st_size // 2
        if count == 0:
            raise ValueError("the corpus yields no sentence pairs; it needs at least two sentences")
        self.rows_path, self.count = rows_path, count
        self._files = PositionalFiles()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.count

    def row(self, index: int) -> tuple[int, int, int, int]:
        """(document, first sentence, end sentence, target) of item ``index`` (a positional read of the index)."""
        values = np.frombuffer(self._files.read(self.rows_path, int(index) * 32, 32), dtype=np.int64)
        return tuple(int(v) for v in values)

    def lengths(self) -> np.ndarray:
        """Approximate tokens per item (the chunk's + 3 special tokens, capped at ``max_seq_length``): for
        length-grouped batching; uint16, read from the cached file."""
        return np.minimum(np.fromfile(self.lengths_path, dtype=np.uint16), self.max_seq_length)

    def _tokens(self, first: int, end: int) -> list[int]:
        return self.corpus.span(first, end) if end > first else []

    def __getitem__(self, index: int) -> dict:
        seed = zlib.crc32(f"{self.seed}-{self.epoch}-{index}".encode())
        rng = random.Random(seed)
        doc, first, end, target = self.row(index)
        doc_first, doc_end = self.corpus.sentences(doc)
        is_random = len(self.documents) > 1 and rng.random() < 0.5 and self.random_next
        if not is_random and end - first == 1:
            if end < doc_end:
                end += 1  # the next sentence is the true B
            elif first > doc_first:
                first -= 1  # the document's last sentence: the previous one becomes A
            elif len(self.documents) > 1 and self.random_next:
                is_random = True
        a_end = first + (rng.randint(1, end - first - 1) if end - first >= 2 else 1)
        tokens_a = self._tokens(first, a_end)
        if is_random:
            other = doc
            for _ in range(10):
                other = int(self.documents[rng.randrange(len(self.documents))])
                if other != doc:
                    break
            o_first, o_end = self.corpus.sentences(other)
            start = rng.randrange(o_first, o_end)
            target_b = max(1, target - len(tokens_a))
            # Sentences from ``start`` until B reaches its target (or the document ends): one read of their offsets.
            filled = self.corpus.read_offsets("sentence_offsets", start, o_end + 1)
            count = min(int(np.searchsorted(filled[1:] - filled[0], target_b)) + 1, o_end - start)
            tokens_b = self._tokens(start, start + count)
        else:
            tokens_b = self._tokens(a_end, end)
        truncate_pair(tokens_a, tokens_b, self.max_tokens, rng)
        if not tokens_b:  # a one-sentence corpus cannot give B: repeat A's last token rather than fail mid-epoch
            tokens_b = tokens_a[-1:]
        return {
            "input_ids": [self.cls_id, *tokens_a, self.sep_id, *tokens_b, self.sep_id],
            "token_type_ids": [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1),
            "next_sentence_label": IS_RANDOM if is_random else IS_NEXT,
            "mask_seed": seed & 0x7FFFFFFF,
        }


__all__ = ["CorpusPairsDataset", "split_documents", "build_sample_index"]
