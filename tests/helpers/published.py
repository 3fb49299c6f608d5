"""Builders of the published-checkpoint tests: exact-size WordPiece tokenizers, ragged text and region batches, perturbed weights, a tiny UNITER checkpoint file."""

from __future__ import annotations

import json

import torch
import transformers

from helpers.published_references import (
    uniter_state,
)

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_tokenizer(directory, size: int, cased: bool, words=()):
    """A WordPiece tokenizer of exactly ``size`` pieces (specials, ``words``, then filler pieces), cased or not."""
    directory.mkdir(parents=True, exist_ok=True)
    pieces = SPECIALS + list(words)
    pieces += [f"w{i}" for i in range(size - len(pieces))]
    tok = transformers.BertTokenizerFast(vocab={p: i for i, p in enumerate(pieces[:size])}, do_lower_case=not cased)
    tok.save_pretrained(str(directory))
    return directory


def ragged_regions(batch, regions, dim, counts, seed=0):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(batch, regions, dim, generator=g)
    xy = torch.rand(batch, regions, 2, generator=g) * 0.5
    wh = torch.rand(batch, regions, 2, generator=g) * 0.5 + 0.05
    boxes = torch.cat([xy, (xy + wh).clamp(max=1.0)], -1)
    mask = (torch.arange(regions)[None] < torch.tensor(counts)[:, None]).long()
    return features, boxes, mask


def ragged_text(batch, length, vocab, lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, length), generator=g)
    mask = (torch.arange(length)[None] < torch.tensor(lengths)[:, None]).long()
    ids = ids.masked_fill(mask == 0, 0)
    ids[:, 0] = 2  # [CLS]
    return ids, mask


def perturb_(model, seed=0):
    """Random values everywhere (LayerNorms and biases included), so every parameter's mapping matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


VB_SIZES = {
    "small": dict(
        vocab_size=90,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=40,
        visual_embedding_dim=24,
        max_position_embeddings=64,
    ),
    "base": dict(
        vocab_size=300,
        hidden_size=768,
        num_hidden_layers=2,
        num_attention_heads=12,
        intermediate_size=3072,
        visual_embedding_dim=2048,
        max_position_embeddings=512,
    ),
}


UNITER_CONFIG = {"num_attention_heads": 4}


def write_uniter(tmp_path, name="uniter.pt", **kwargs):
    state = uniter_state(**kwargs)
    torch.save(state, tmp_path / name)
    (tmp_path / "uniter-tiny.json").write_text(json.dumps(UNITER_CONFIG))
    return state, tmp_path / name
