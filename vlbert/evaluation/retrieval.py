"""Image-text retrieval metrics (Karpathy & Fei-Fei 2015; UNITER section 4): Recall@K in both directions."""

from __future__ import annotations

from typing import Sequence

import torch


def recall_at_k(scores: torch.Tensor, positives: Sequence[set[int]] | torch.Tensor,
                ks: Sequence[int] = (1, 5, 10)) -> dict[int, float]:
    """Share of queries with at least one correct item among their top K.

    Args:
        scores: float [Q, N], higher = better match of query q with item n. Items not scored (outside a
            shortlist) should be -inf.
        positives: for each query, the set of correct item indices (or a bool [Q, N] matrix).
        ks: the K values.
    Returns:
        {K: recall in [0, 1]}.
    Raises:
        ValueError: shapes disagree or a query has no positive.
    """
    q, n = scores.shape
    if isinstance(positives, torch.Tensor):
        truth = positives.bool()
    else:
        if len(positives) != q:
            raise ValueError(f"{len(positives)} positive sets for {q} queries")
        truth = torch.zeros(q, n, dtype=torch.bool)
        for i, items in enumerate(positives):
            truth[i, list(items)] = True
    if truth.shape != scores.shape:
        raise ValueError(f"positives {tuple(truth.shape)} and scores {tuple(scores.shape)} differ")
    if not truth.any(1).all():
        raise ValueError("every query needs at least one correct item")
    order = scores.argsort(dim=1, descending=True)
    hit_rank = truth.gather(1, order).float().argmax(1)  # rank of the first correct item
    return {k: float((hit_rank < k).float().mean()) for k in ks}


__all__ = ["recall_at_k"]
