"""BERT pretraining data: masking statistics (15%; 80/10/10) and its determinism, corpus loading and its errors,
and length-grouped batching. (NSP pairing: tests/data/test_corpus_pairs.py.)"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from vlbert.data.corpus import load_documents, split_sentences, train_eval_split
from vlbert.data.corpus_pairs import CorpusPairsDataset
from vlbert.data.pretraining import LengthGroupedBatchSampler, MaskingCollator


def within(observed: float, expected: float, n: int, sigmas: float = 4.0) -> bool:
    """|observed - expected| within `sigmas` binomial standard errors."""
    return abs(observed - expected) <= sigmas * math.sqrt(expected * (1 - expected) / n)


@pytest.fixture(scope="module")
def dataset(small_token_corpus, tokenizer):
    return CorpusPairsDataset(
        small_token_corpus, np.arange(small_token_corpus.num_documents), tokenizer, max_seq_length=64, seed=0
    )


def test_masking_statistics(dataset, tokenizer):
    collator = MaskingCollator.from_tokenizer(tokenizer)
    special = torch.tensor(tokenizer.all_special_ids)
    chosen = maskable = as_mask = as_random = unchanged = 0
    for start in range(0, len(dataset), 64):
        items = [dataset[i] for i in range(start, min(start + 64, len(dataset)))]
        original = collator.pad(items)["input_ids"]
        batch = collator(items)
        selected = batch["labels"] != -100
        assert torch.equal(batch["labels"][selected], original[selected]), "labels hold the original ids"
        assert not torch.isin(original[selected], special).any(), "special tokens and padding are never chosen"
        assert torch.equal(batch["input_ids"][~selected], original[~selected]), "unchosen positions untouched"
        assert (selected.sum(1) >= 1).all()
        maskable += int((~torch.isin(original, special)).sum())
        chosen += int(selected.sum())
        as_mask += int((batch["input_ids"][selected] == tokenizer.mask_token_id).sum())
        same = batch["input_ids"][selected] == original[selected]
        unchanged += int(same.sum())
        as_random += int((~same & (batch["input_ids"][selected] != tokenizer.mask_token_id)).sum())
    assert abs(chosen / maskable - 0.15) < 0.005  # per-sequence round(0.15 n): only rounding error
    assert within(as_mask / chosen, 0.8, chosen)
    # A random replacement draws the original id 1 time in |V|; it then counts as unchanged.
    assert within(as_random / chosen, 0.1, chosen)
    assert within(unchanged / chosen, 0.1, chosen)


def test_masking_is_dynamic_and_reproducible(dataset, tokenizer):
    collator = MaskingCollator.from_tokenizer(tokenizer)
    items = [dataset[i] for i in range(16)]
    a, b = collator(items), collator(items)
    assert torch.equal(a["labels"], b["labels"]), "same samples, same seeds -> same masking"
    dataset.set_epoch(1)
    try:
        c = collator([dataset[i] for i in range(16)])
    finally:
        dataset.set_epoch(0)
    assert not torch.equal(a["labels"][:, : c["labels"].shape[1]], c["labels"][:, : a["labels"].shape[1]])


def test_split_sentences():
    doc = 'A Title Line\n\nFirst sentence here. Second one? Yes! "Quoted start." 3 items remain.\n'
    assert split_sentences(doc) == [
        "A Title Line",
        "First sentence here.",
        "Second one?",
        "Yes!",
        '"Quoted start."',
        "3 items remain.",
    ]


def test_corpus_formats_and_errors(tmp_path):
    (tmp_path / "a.txt").write_text("Doc one. It has two sentences.\n\nDoc two here.\n")
    assert load_documents(tmp_path / "a.txt") == ["Doc one. It has two sentences.", "Doc two here."]
    (tmp_path / "c.jsonl").write_text('{"text": "first doc"}\n{"text": "second doc"}\n')
    assert load_documents(tmp_path / "c.jsonl") == ["first doc", "second doc"]
    with pytest.raises(ValueError, match="no field 'body'"):
        load_documents(tmp_path / "c.jsonl", text_field="body")
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    with pytest.raises(ValueError, match="empty"):
        load_documents(tmp_path / "empty.txt")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_documents(tmp_path / "missing.txt")
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9 au lait")
    with pytest.raises(ValueError, match="not valid UTF-8"):
        load_documents(tmp_path / "bad.txt")


def test_bbc_news_default_corpus():
    docs = load_documents("bbc-news")
    assert len(docs) == 2127  # 2,225 files, 98 verbatim repeats dropped
    assert all("\ufffd" not in d for d in docs)
    train, held = train_eval_split(docs, 0.05, seed=0)
    assert len(held) == round(2127 * 0.05) and not set(train) & set(held)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_length_grouped_sampler_partitions_items(world_size):
    rng = random.Random(0)
    lengths = [rng.randint(5, 128) for _ in range(1000)]
    per_rank = [
        LengthGroupedBatchSampler(lengths, 8, seed=1, group_size=20, rank=r, world_size=world_size).batches()
        for r in range(world_size)
    ]
    assert len({len(b) for b in per_rank}) == 1, "every rank takes the same number of steps"
    seen = [i for batches in per_rank for b in batches for i in b]
    assert len(seen) == len(set(seen)), "no item on two ranks or twice"
    assert len(seen) >= 1000 - 8 * world_size
    grouped = LengthGroupedBatchSampler(lengths, 8, seed=1, group_size=20).batches()
    plain = LengthGroupedBatchSampler(lengths, 8, seed=1, group_size=1).batches()
    padding = lambda bs: sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in bs)
    assert padding(grouped) < padding(plain) / 3


@pytest.mark.parametrize("world_size", range(1, 9))
def test_every_rank_gets_items_in_every_batch(world_size):
    """The last, short global batch is split as evenly as possible: no rank gets an empty batch (an empty rank
    failed in collation while the others waited in the all-reduce), and the ranks' slices are the global batch."""
    for n in (world_size, world_size + 1, 28, 29, 8 * world_size + 1, 8 * world_size - 1, 100):
        samplers = [
            LengthGroupedBatchSampler([5] * n, 8, seed=2, rank=r, world_size=world_size, drop_last=False)
            for r in range(world_size)
        ]
        per_rank = [s.batches() for s in samplers]
        global_batches = samplers[0].global_batches()
        assert all(len(b) == len(global_batches) for b in per_rank)
        for step, batch in enumerate(global_batches):
            slices = [per_rank[r][step] for r in range(world_size)]
            assert all(len(s) >= 1 for s in slices), (n, world_size, [len(s) for s in slices])
            assert np.array_equal(np.concatenate(slices), batch)


def test_evaluation_batches_are_shared_out_across_ranks():
    """Each rank evaluates its share of the held-out batches (it used to run them all: N-fold compute)."""
    from vlbert.data.loading import eval_loader

    class Items:
        def __init__(self, n):
            self.n = n

        def lengths(self):
            return [1 + i % 7 for i in range(self.n)]

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return i

    data = Items(53)
    whole = [list(b) for b in eval_loader(data, list, 8)]
    for world in (2, 3, 5):
        shares = [[list(b) for b in eval_loader(data, list, 8, rank=r, world_size=world)] for r in range(world)]
        assert sorted(sum(shares, [])) == sorted(whole)
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
