"""Generating text from a masked LM, for text models and conditioned on an image's regions:

* mask-predict (Ghazvininejad et al. 2019, section 3): start from ``length`` [MASK]s; each iteration predicts
  every masked position in parallel, then re-masks the n = length x (T - t - 1) / T least confident tokens;
* Gibbs sampling (Wang & Cho 2019, "BERT has a mouth"): start from [MASK]s and repeatedly re-sample one position at
  a time from the masked LM's distribution given all the others.
"""

from __future__ import annotations

import torch

from vlbert.processing.regions import pad_regions


def _logits(model, ids: torch.Tensor, extra: dict) -> torch.Tensor:
    """MLM logits [B, T, V] (float32) of a batch of ids (no padding)."""
    out = model(ids, torch.zeros_like(ids), torch.ones_like(ids), **extra)
    return out.prediction_logits.float()


def _start(tokenizer, length: int, batch: int, device) -> torch.Tensor:
    ids = torch.full((batch, length + 2), tokenizer.mask_token_id, dtype=torch.long, device=device)
    ids[:, 0], ids[:, -1] = tokenizer.cls_token_id, tokenizer.sep_token_id
    return ids


def _inputs(model, regions: list[dict] | None, region_mask_off: bool) -> dict:
    if regions is None:
        return {}
    device = next(model.parameters()).device

    extra = {k: v.to(device) for k, v in pad_regions(regions).items()}
    if region_mask_off:
        extra["region_mask"] = torch.zeros_like(extra["region_mask"])
    return extra


@torch.no_grad()
def mask_predict(
    model,
    tokenizer,
    length: int,
    iterations: int = 4,
    regions: list[dict] | None = None,
    batch: int = 1,
    mask_regions: bool = False,
) -> list[str]:
    """Texts of ``length`` wordpieces by mask-predict (see module docstring).

    Args:
        model: a BertForPreTraining or VLBertForPreTraining (eval mode is set for the call).
        length: wordpieces between [CLS] and [SEP].
        iterations: T, the number of parallel decoding passes (T = 1: one pass, argmax everywhere).
        regions: for a VL model, one region item per text (``vlbert.processing.regions.region_item``); ``batch`` is then
            ``len(regions)``.
        mask_regions: give the regions but mask them all out (the same model without the image).
    Returns:
        the decoded texts.
    Raises:
        ValueError: length or iterations < 1.
    """
    if length < 1 or iterations < 1:
        raise ValueError(f"length and iterations must be >= 1, got {length}, {iterations}")
    device = next(model.parameters()).device
    batch = len(regions) if regions is not None else batch
    extra = _inputs(model, regions, mask_regions)
    was_training = model.training
    model.eval()
    ids = _start(tokenizer, length, batch, device)
    confidence = torch.zeros(batch, length + 2, device=device)
    inner = slice(1, length + 1)
    try:
        for t in range(iterations):
            masked = ids == tokenizer.mask_token_id
            probs = _logits(model, ids, extra).softmax(-1)
            best, token = probs.max(-1)
            ids = torch.where(masked, token, ids)
            confidence = torch.where(masked, best, confidence)
            n = int(length * (iterations - t - 1) / iterations)
            if n:
                lowest = confidence[:, inner].topk(n, dim=1, largest=False).indices + 1
                ids.scatter_(1, lowest, tokenizer.mask_token_id)
    finally:
        model.train(was_training)
    return [tokenizer.decode(row[inner]) for row in ids]


@torch.no_grad()
def gibbs_sample(
    model,
    tokenizer,
    length: int,
    sweeps: int = 4,
    temperature: float = 1.0,
    regions: list[dict] | None = None,
    batch: int = 1,
    mask_regions: bool = False,
    seed: int = 0,
) -> list[str]:
    """Texts of ``length`` wordpieces by Gibbs sampling from the masked LM (see module docstring): ``sweeps``
    passes over the positions in random order, each position masked and re-drawn from softmax(logits /
    ``temperature``) given the rest; deterministic in ``seed``. Other arguments as :func:`mask_predict`."""
    if length < 1 or sweeps < 1 or not temperature > 0:
        raise ValueError(f"length and sweeps must be >= 1 and temperature > 0, got {length}, {sweeps}, {temperature}")
    device = next(model.parameters()).device
    batch = len(regions) if regions is not None else batch
    extra = _inputs(model, regions, mask_regions)
    generator = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    ids = _start(tokenizer, length, batch, device)
    try:
        for _ in range(sweeps):
            for position in (torch.randperm(length, generator=generator) + 1).tolist():
                ids[:, position] = tokenizer.mask_token_id
                probs = (_logits(model, ids, extra)[:, position] / temperature).softmax(-1).cpu()
                ids[:, position] = torch.multinomial(probs, 1, generator=generator).squeeze(1).to(device)
    finally:
        model.train(was_training)
    return [tokenizer.decode(row[1 : length + 1]) for row in ids]


__all__ = ["mask_predict", "gibbs_sample"]
