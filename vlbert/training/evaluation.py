"""Held-out evaluation of an objective model: every objective's loss and metric, weighted by prediction counts,
summed over the ranks (each evaluates its share of the batches)."""

from __future__ import annotations

import math
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

    Returns keys ``eval_<objective>_loss`` and ``eval_<metric>`` (e.g. eval_mlm_accuracy), floats. Where the model
    gives its per-prediction second moments (``out.squares``: the pretraining units), also ``<key>_n`` (the
    predictions averaged over, float) and ``<key>_stderr``, the standard error of the mean, sqrt(var / n) with var
    the per-prediction variance E[x^2] - E[x]^2 (for a 0/1 accuracy p(1 - p): the binomial standard error).
    Predictions are taken as independent (the masked wordpieces of one caption are not quite; the figure is then a
    lower bound).
    """
    model.eval()
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for batch in batches:
        with autocast():
            out = model(**(inputs(batch) if inputs is not None else batch))
        if outputs is not None:
            outputs.update(batch, out)
        squares = getattr(out, "squares", {})
        for key, value, n in (
            [(f"eval_{name}_loss", loss, out.counts.get(name, 1)) for name, loss in out.losses.items()]
            + [(f"eval_{name}", v, out.counts.get(name, 1)) for name, v in out.metrics.items()]
            + [(f"eval_{name}{_SQUARES}", v, out.counts.get(name, 1)) for name, v in squares.items()]
        ):
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
    means = {k: s / max(w, 1e-12) for k, (s, w) in sorted(totals.items())}
    return {**{k: v for k, v in means.items() if not k.endswith(_SQUARES)}, **_standard_errors(means, totals)}


_SQUARES = "_squares"  # the running second moments' keys (folded into ``_stderr`` before returning)


def _standard_errors(means: dict[str, float], totals: dict[str, list[float]]) -> dict[str, float]:
    """``<key>_n`` and ``<key>_stderr`` for every ``<key>`` (a loss is ``eval_<name>_loss``, its squares
    ``eval_<name>_squares``) with a second moment in ``means``."""
    out = {}
    for key, second in means.items():
        if not key.endswith(_SQUARES):
            continue
        base = key[: -len(_SQUARES)]
        target = base + "_loss" if base + "_loss" in means else base
        if target not in means:
            continue
        n = totals[key][1]
        variance = max(second - means[target] ** 2, 0.0)
        out[f"{target}_n"], out[f"{target}_stderr"] = int(round(n)), math.sqrt(variance / max(n, 1.0))
    return out


__all__ = ["evaluate_objectives"]
