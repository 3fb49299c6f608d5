"""Drawing hard negatives in proportion to similarity, on the device and without a host synchronisation.

Source: ALBEF (Li et al. 2021, section 3.2; salesforce/ALBEF ``models/model_pretrain.py`` at 90541c9): a hard
negative for an anchor is drawn from the softmax of its similarities to the candidates, candidates of its own
group excluded. ALBEF calls ``torch.multinomial`` once per row; here every row is drawn at once by inverting its
cumulative distribution at a uniform number the caller supplies, so the draw of a row depends on that number and
its weights only (the same in one process or N; the VL collator supplies the numbers from each item's seed).
"""

from __future__ import annotations

import torch


def draw_by_similarity(logits: torch.Tensor, exclude: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """For each anchor (row) of float ``logits`` [B, N] (similarity / temperature), the index of one candidate
    drawn with probability softmax(logits[i]) renormalised over the candidates where bool ``exclude`` [B, N] is
    False; ``uniforms`` float [B] in [0, 1) (one per row) decide the draw. A row whose candidates are all excluded
    draws uniformly among them all (a tiny floor weight keeps every row drawable). Returns int64 [B]."""
    weights = logits.float().softmax(1).masked_fill(exclude, 0) + 1e-8
    cdf = weights.cumsum(1)
    target = uniforms.to(cdf)[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=logits.shape[1] - 1)


__all__ = ["draw_by_similarity"]
