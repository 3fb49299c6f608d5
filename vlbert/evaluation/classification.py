"""Predictions of a classification head over held-out batches, for the accuracy of the VL classification tasks."""

from __future__ import annotations

from typing import Iterable, Sequence

from vlbert.utils import evaluation


@evaluation
def predict_labels(
    model, batches: Iterable[dict], target_keys: Sequence[str] = ("labels",)
) -> tuple[list[int], list[int], list[int]]:
    """(dataset indices, gold labels, predicted labels) over ``batches`` (dicts of model inputs plus the task's
    ``target_keys`` and ``index`` int64 [B], the items' dataset indices): the argmax of the model's ``logits``
    [B, C] for every example, in batch order. The gold labels are the first target key's values where it holds one
    class per item (int64 [B]: ``labels``, ``target_region``), else None per example (VQA's soft scores). The model
    runs in eval mode without gradients and is given back in the mode it was in."""
    device = next(model.parameters()).device
    index, gold, predicted = [], [], []
    for batch in batches:
        index += batch.pop("index").tolist()
        targets = [batch.pop(k) for k in target_keys]
        n = len(batch["input_ids"])
        gold += targets[0].tolist() if targets and targets[0].dim() == 1 else [None] * n
        logits = model(**{k: v.to(device) for k, v in batch.items()}).logits
        predicted += logits.argmax(-1).tolist()
    return index, gold, predicted


__all__ = ["predict_labels"]
