"""Held-out evaluation of an objective model: every objective's loss and metric, weighted by prediction counts,
summed over the ranks (each evaluates its share of the batches)."""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from accelerate.utils import gather_object


@torch.no_grad()
def evaluate_objectives(
    model: torch.nn.Module,
    batches: Iterable[dict],
    autocast: Callable,
    inputs: Callable[[dict], dict] | None = None,
    outputs=None,
) -> dict[str, float]:
    """Average every objective's loss and metric over ``batches`` in eval mode, weighted by the predictions each
    averages over (``out.counts``), then over all ranks (a rank may have had no batch). ``autocast``: a
    context-manager factory (accelerate's). The model is put back in training mode.

    ``inputs(batch)``: the model's arguments on its device (default: the batch as it is). ``outputs``: an object
    with ``update(batch, output)``, called with every batch as it came and the model's output for it, and
    ``finish()`` after the last (e.g. :class:`~vlbert.evaluation.predictions.HeldOutPredictions`: a task's
    predictions from the same forwards).

    Returns keys ``eval_<objective>_loss`` and ``eval_<metric>`` (e.g. eval_mlm_accuracy), floats.
    """
    model.eval()
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for batch in batches:
        with autocast():
            out = model(**(inputs(batch) if inputs is not None else batch))
        if outputs is not None:
            outputs.update(batch, out)
        for key, value, n in [
            (f"eval_{name}_loss", loss, out.counts.get(name, 1)) for name, loss in out.losses.items()
        ] + [(f"eval_{name}", v, out.counts.get(name, 1)) for name, v in out.metrics.items()]:
            n = float(n)  # an int, or a 0-d tensor (qa's question rows)
            sums[key] = sums.get(key, 0.0) + float(value) * n
            weights[key] = weights.get(key, 0.0) + n
    model.train()
    if outputs is not None:
        outputs.finish()
    totals: dict[str, list[float]] = {}
    for part_sums, part_weights in gather_object([(sums, weights)]):
        for k, v in part_sums.items():
            total = totals.setdefault(k, [0.0, 0.0])
            total[0] += v
            total[1] += part_weights[k]
    return {k: s / max(w, 1e-12) for k, (s, w) in sorted(totals.items())}


__all__ = ["evaluate_objectives"]
