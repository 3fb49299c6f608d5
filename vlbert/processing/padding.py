"""Padding wordpiece sequences into a batch: the text half of every collator."""

from __future__ import annotations

import torch


def pad_text(items: list[dict], pad_token_id: int, pad_to_multiple_of: int = 8) -> dict[str, torch.Tensor]:
    """Pad each item's ``input_ids`` (and ``token_type_ids`` when present) to one length.

    Args:
        items: dicts with ``input_ids`` (list of int, special tokens included) and optionally ``token_type_ids``.
        pad_token_id: the tokenizer's [PAD] id.
        pad_to_multiple_of: round the length up to a multiple of this (tensor-core friendly; 1 = off).
    Returns:
        input_ids, token_type_ids (0 where not given), attention_mask (1 = real token): int64 [B, T], T = the
        longest item rounded up.
    Raises:
        ValueError: no items.
    """
    if not items:
        raise ValueError("cannot collate an empty batch")
    length = max(len(x["input_ids"]) for x in items)
    m = pad_to_multiple_of
    if m and m > 1:
        length = (length + m - 1) // m * m
    batch = len(items)
    input_ids = torch.full((batch, length), pad_token_id, dtype=torch.long)
    token_type_ids = torch.zeros((batch, length), dtype=torch.long)
    attention_mask = torch.zeros((batch, length), dtype=torch.long)
    for row, x in enumerate(items):
        n = len(x["input_ids"])
        input_ids[row, :n] = torch.tensor(x["input_ids"])
        if "token_type_ids" in x:
            token_type_ids[row, :n] = torch.tensor(x["token_type_ids"])
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


__all__ = ["pad_text"]
