"""Losses shared by the pretraining objectives and the fine-tuning heads, computed in at least float32."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from vlbert.layers.kernels import cross_entropy_with_accuracy

if TYPE_CHECKING:
    from vlbert.layers.pretraining_heads import MaskedLMHead

IGNORE_INDEX = -100  # label of positions no loss reads (transformers' convention)


def upcast(x: torch.Tensor) -> torch.Tensor:
    """Losses are computed in at least float32 (bf16/fp16 logits are upcast; float64 stays float64)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def masked_positions(labels: torch.Tensor) -> torch.Tensor:
    """int64 [N]: the flat positions (row * T + column) of the labelled entries (not -100) of int64 [B, T]
    ``labels``, in row order: the rows the masked-LM head reads (``masked_lm_positions``)."""
    return (labels.reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1)


def masked_lm_loss(
    head: MaskedLMHead,
    word_embeddings: torch.Tensor,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Sparse masked-LM loss: the vocabulary projection runs on masked positions only.

    Args:
        head, word_embeddings: the MLM head and the tied [V, H] matrix.
        hidden: float [B, T, H] (text positions only).
        labels: int64 [B, T], the original token id at masked positions, -100 elsewhere.
        positions: int64 [N], the flat positions (row * T + column) of the masked tokens, as the collator computed
            them on the host; without them they are read from ``labels`` (a boolean index: a host sync on an
            accelerator).
    Returns:
        (mean cross-entropy over masked positions, logits float [N, V], accuracy, N). With N = 0 the loss is
        a zero that still depends on the head's parameters, so ``backward`` and DDP see every parameter.
    """
    if positions is None:
        positions = masked_positions(labels)
    targets = labels.reshape(-1).index_select(0, positions)
    padded = head(hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions), word_embeddings, padded=True)
    logits = padded[:, : word_embeddings.shape[0]]  # the padded vocabulary's extra logits are -inf: the loss is equal
    count = targets.numel()
    if count == 0:
        zero = logits.sum() * 0.0
        return zero, logits, zero.detach(), 0
    loss, accuracy = cross_entropy_with_accuracy(padded, targets)
    return loss, logits, accuracy, count


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Cross-entropy and accuracy of [N, C] logits against int64 [N] labels. Returns (loss, accuracy, N)."""
    loss = F.cross_entropy(upcast(logits), labels)
    with torch.no_grad():
        accuracy = (logits.argmax(-1) == labels).float().mean()
    return loss, accuracy, labels.numel()


__all__ = ["IGNORE_INDEX", "upcast", "masked_positions", "masked_lm_loss", "classification_loss"]
