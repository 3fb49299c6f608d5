"""What the VL classification tasks keep of a held-out batch's output for their accuracy: each example's gold label
and the head's argmax (:class:`~vlbert.evaluation.predictions.HeldOutPredictions`' ``keep``)."""

from __future__ import annotations

from typing import Sequence


def kept_labels(batch: dict, output, target_keys: Sequence[str] = ("labels",)) -> list[tuple[int, tuple]]:
    """``[(dataset index, (gold label, predicted label)), ...]`` of one held-out batch: ``batch`` holds ``index``
    int64 [B] (the items' dataset indices) and the task's ``target_keys``; the prediction is the argmax of the
    model's ``logits`` [B, C]. The gold label is the first target key's value where it holds one class per item
    (int64 [B]: ``labels``, ``target_region``), else None (VQA's soft scores [B, A])."""
    index = batch["index"].tolist()
    targets = batch[target_keys[0]] if target_keys else None
    gold = targets.tolist() if targets is not None and targets.dim() == 1 else [None] * len(index)
    predicted = output.logits.argmax(-1).tolist()
    return list(zip(index, zip(gold, predicted, strict=True), strict=True))


__all__ = ["kept_labels"]
