"""Predictions of a classification head over held-out batches, for the accuracy of the VL classification tasks."""

from __future__ import annotations

from typing import Iterable

from vlbert.utils import evaluation


@evaluation
def predict_labels(model, batches: Iterable[dict]) -> tuple[list[int], list[int]]:
    """(gold labels, predicted labels) over ``batches`` (dicts of model inputs plus ``labels`` int64 [B]): the
    argmax of the model's ``logits`` [B, C] for every example, in batch order; the model runs in eval mode without
    gradients and is given back in the mode it was in."""
    device = next(model.parameters()).device
    gold, predicted = [], []
    for batch in batches:
        labels = batch.pop("labels")
        logits = model(**{k: v.to(device) for k, v in batch.items()}).logits
        gold += labels.tolist()
        predicted += logits.argmax(-1).tolist()
    return gold, predicted


__all__ = ["predict_labels"]
