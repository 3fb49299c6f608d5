"""Small ragged batches every model class takes (the model contract's): B texts of T tokens, R regions of D features."""

from __future__ import annotations

import torch

B, T, R, D = 3, 7, 5, 12


def text(vocab=50):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    ids[:, 0] = 2  # [CLS]-like
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def regions(pairs: bool = False):
    g = torch.Generator().manual_seed(1)
    shape = (B, 2, R) if pairs else (B, R)
    xy = torch.rand(*shape, 2, generator=g) * 0.5
    mask = torch.ones(*shape, dtype=torch.long)
    mask[1, ..., 3:] = 0
    return {
        "region_features": torch.randn(*shape, D, generator=g),
        "region_boxes": torch.cat([xy, xy + 0.4], -1),
        "region_mask": mask,
    }


def mlm_labels(batch):
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 1] = batch["input_ids"][:, 1]
    return labels
