"""Drawing hard negatives in proportion to similarity, on the device and without a host synchronisation.

Source: ALBEF (Li et al. 2021, section 3.2; salesforce/ALBEF ``models/model_pretrain.py`` at 90541c9): a hard
negative for an anchor is drawn from the softmax of its similarities to the candidates, candidates of its own
group excluded. ALBEF calls ``torch.multinomial`` once per row; here every row is drawn at once by inverting its
cumulative distribution at a uniform number the caller supplies, so the draw of a row depends on that number and
its weights only (the same in one process or N; the VL collator supplies the numbers from each item's seed).
"""

from __future__ import annotations

import torch


def draw_by_similarity(
    logits: torch.Tensor, exclude: torch.Tensor, uniforms: torch.Tensor, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """For each anchor (row) of float ``logits`` [B, N] (similarity / temperature), the index of one candidate
    drawn with probability softmax(logits[i]) renormalised over the candidates where bool ``exclude`` [B, N] is
    False; ``uniforms`` float [B] in [0, 1) (one per row) decide the draw. A row whose candidates are all excluded
    draws uniformly among them all (a tiny floor weight keeps every row drawable). ``valid``: bool [N], the
    candidates that exist (False: a padded column of a global batch gathered to fixed bounds,
    :func:`~vlbert.utils.all_gather_padded`), never drawn and left out of the softmax, so a draw equals the one over
    the valid columns alone; None: all exist. Returns int64 [B]."""
    logits = logits.float()
    floor = torch.full_like(logits[:1], 1e-8)
    if valid is not None:
        logits = logits.masked_fill(~valid, float("-inf"))
        floor = floor.masked_fill(~valid, 0.0)
    weights = logits.softmax(1).masked_fill(exclude, 0) + floor
    cdf = weights.cumsum(1)
    target = uniforms.to(cdf)[:, None] * cdf[:, -1:]
    chosen = torch.searchsorted(cdf, target, right=True).squeeze(1)
    # the last candidate of positive weight: a target rounded up to the total must not land past it (on padding)
    columns = torch.arange(logits.shape[1], device=logits.device)
    last = torch.where(weights > 0, columns, 0).amax(1)
    return torch.minimum(chosen, last)


__all__ = ["draw_by_similarity"]
