"""The table a person reads at the end of a run: each result, its baseline and whether the run beat it.

A training tool's final metrics are a flat dict (``metrics.json``): held-out objective metrics (``eval_mlm_accuracy``),
task metrics (``vqa_accuracy``, ``entity_f1``), bookkeeping (``train_seconds``) and the baselines the recipes compute
beside them (``<metric>_majority_baseline``, ``<metric>_majority_position_baseline``, ``<metric>_before`` for the
same measure on the untrained model). A pretraining unit's chance level (NSP, SOP and ITM: balanced yes/no pairs,
0.5) is its :attr:`vlbert.objectives.base.Objective.chance`; one that depends on the batch is a metric of its own
(``eval_itc_accuracy_chance``, a uniform guess's ITC accuracy on the same batches). VL pretraining gives every held-out
result one (:mod:`vlbert.recipes.vl_baselines`: the most frequent wordpiece, the unigram prior, the detector's class
prior, the mean region feature). :func:`results_table` lines each result up with its baseline and says whether it
beat it: by more than :data:`Z` standard errors of its held-out mean where the run measured one
(``<result>_stderr``, with ``<result>_n`` the predictions it averages: :func:`vlbert.training.evaluation.evaluate_objectives`),
else by :data:`MARGIN`; a loss (:data:`LOWER_IS_BETTER`) beats its baseline by being lower. :func:`chance_notes` says,
in one line a result, what a result still at its baseline means.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from vlbert.objectives.registry import OBJECTIVES

#: A result without a standard error beats its baseline when it exceeds it by more than this (absolute, on a [0, 1]
#: scale): about two standard errors of an accuracy near 0.5 measured on 2,500 held-out items, so a smaller lead is
#: not read as learning.
MARGIN = 0.02

#: A result with a standard error (``<result>_stderr``) beats its baseline when it is better by more than Z of them:
#: the baseline is a fixed predictor, so the lead's noise is the result's own sampling error, and a normal mean
#: outside +-2 standard errors happens by chance about 1 time in 20 (two-sided 95%: 1.96).
Z = 2.0

#: Result key suffixes whose lower value is the better one (losses, squared errors).
LOWER_IS_BETTER = ("_loss", "_mse")

#: Baseline key suffixes and how the table names them, in order of preference for one result.
BASELINE_SUFFIXES = (
    ("_majority_baseline", "majority class"),
    ("_majority_position_baseline", "majority position"),
    ("_unigram_baseline", "unigram prior"),
    ("_class_prior_baseline", "class prior"),
    ("_mean_feature_baseline", "mean feature"),
    ("_before", "before training"),
    ("_chance", "chance"),
)

#: Suffixes of a result's sampling figures (the table folds them into the verdict; still in metrics.json).
SAMPLING_SUFFIXES = ("_stderr", "_n")

#: Bookkeeping entries that are no result (left out of the table; still in metrics.json).
BOOKKEEPING = frozenset({"step", "train_seconds", "train_tokens_per_s", "steps_this_run", "skipped_steps"})

#: What a unit at its chance level means at the quick start's scale, by unit name; others get the general line.
AT_CHANCE = {
    "nsp": "next-sentence prediction usually stays at chance for the first few thousand steps of a small BERT on a "
    "small corpus (transformers' BERT on the same batches is at chance after 200 NSP steps too); MLM is the "
    "signal to read here, NSP needs a longer run (--max-steps)",
    "sop": "sentence-order prediction usually stays at chance for the first few thousand steps at this size; MLM "
    "is the signal to read here, SOP needs a longer run (--max-steps)",
    "itm": "image-text matching usually stays at chance until the masked objectives have shaped the regions' "
    "embeddings (thousands of steps at the default size); MLM and the region objectives are the signal "
    "to read here, ITM needs a longer run (--max-steps)",
}


def _chance_levels() -> dict[str, tuple[str, float]]:
    """``eval_<metric>`` -> (unit name, chance level) of every unit that declares one."""
    return {
        f"eval_{unit.metric}": (unit.name, unit.chance)
        for unit in OBJECTIVES.values()
        if getattr(unit, "chance", None) is not None
    }


def baseline_of(key: str, metrics: Mapping[str, Any]) -> tuple[float, str] | None:
    """(value, what it is) of the baseline for the result ``key`` of ``metrics``, or None: a recipe's baseline
    entry (:data:`BASELINE_SUFFIXES`), else the chance level of the pretraining unit whose metric ``key`` is."""
    for suffix, name in BASELINE_SUFFIXES:
        value = metrics.get(key + suffix)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), name
    unit = _chance_levels().get(key)
    return (unit[1], "chance") if unit else None


def _is_baseline_key(key: str, metrics: Mapping[str, Any]) -> bool:
    suffixes = [suffix for suffix, _ in BASELINE_SUFFIXES] + list(SAMPLING_SUFFIXES)
    return any(key.endswith(suffix) and key[: -len(suffix)] in metrics for suffix in suffixes)


def _lead(value: float, baseline: float, stderr: float | None, lower_is_better: bool) -> tuple[float, float]:
    """(how much better ``value`` is than ``baseline``, signed; the lead it must exceed: never under a millionth of
    the baseline's size, so that a result equal to it up to rounding is at it even where every item scored alike)."""
    lead = baseline - value if lower_is_better else value - baseline
    return lead, max(Z * stderr if stderr is not None else MARGIN, 1e-6 * max(1.0, abs(baseline)))


def verdict(value: float, baseline: float, stderr: float | None = None, lower_is_better: bool = False) -> str:
    """``"yes (+0.251)"`` when ``value`` beats ``baseline`` by more than :data:`MARGIN`, or with ``stderr`` (the
    standard error of ``value``'s held-out mean) by more than :data:`Z` of them (``"yes (+0.251, 2 s.e. 0.018)"``);
    ``"at baseline"`` within that, ``"below baseline (-0.040)"`` under it; ``"undefined"`` for nan (e.g. a
    correlation of a constant prediction). ``lower_is_better``: a loss, which beats its baseline by being lower
    (the difference shown is still value - baseline)."""
    if math.isnan(value):
        return "undefined"
    lead, needed = _lead(value, baseline, stderr, lower_is_better)
    shown = f"{value - baseline:+.3f}" + (f", {Z:g} s.e. {needed:.3f}" if stderr is not None else "")
    if lead > needed:
        return f"yes ({shown})"
    return "at baseline" if lead >= -needed else f"below baseline ({shown})"


def _judged(key: str, value: float, metrics: Mapping[str, Any]) -> tuple[float, str, str, bool] | None:
    """(baseline, its name, the verdict, whether the result beat it) of the result ``key``, or None."""
    base = baseline_of(key, metrics)
    if base is None:
        return None
    stderr = metrics.get(key + "_stderr")
    stderr = float(stderr) if isinstance(stderr, (int, float)) and not isinstance(stderr, bool) else None
    lower = key.endswith(LOWER_IS_BETTER)
    lead, needed = _lead(value, base[0], stderr, lower)
    return base[0], base[1], verdict(value, base[0], stderr, lower), not math.isnan(value) and lead > needed


def standard_error(key: str, values: Sequence[float]) -> dict[str, float]:
    """``{key_n: n, key_stderr: s / sqrt(n)}`` of a result that is the mean of the per-item ``values`` (s: their
    standard deviation, ddof 0; for 0/1 hits the binomial sqrt(p(1 - p) / n)), the sampling figures the table's
    verdict reads (a task's own evaluation: VQA's per-question scores, NLVR2's per-statement hits); ``{}`` for no
    values."""
    n = len(values)
    if not n:
        return {}
    mean = sum(values) / n
    variance = max(sum(v * v for v in values) / n - mean * mean, 0.0)
    return {f"{key}_n": n, f"{key}_stderr": math.sqrt(variance / n)}


def results_table(metrics: Mapping[str, Any]) -> str:
    """The end-of-run table of ``metrics`` (a run's final metrics, e.g. ``metrics.json``): one row a result with a
    number (baselines, sampling figures and bookkeeping folded away), those with a baseline first, as
    ``result | value | baseline | beats it by > Z s.e. (else MARGIN)?`` (:func:`verdict`); then
    :func:`chance_notes`. Plain text, 4 columns."""
    rows, rest = [], []
    for key, value in metrics.items():
        if (
            key in BOOKKEEPING
            or not isinstance(value, (int, float))
            or isinstance(value, bool)
            or _is_baseline_key(key, metrics)
        ):
            continue
        judged = _judged(key, float(value), metrics)
        if judged is None:
            rest.append((key, _number(value), "", ""))
        else:
            rows.append((key, _number(value), f"{judged[0]:.4f} {judged[1]}", judged[2]))
    table = [("result", "value", "baseline", f"beats it by > {Z:g} s.e. (else {MARGIN})?")] + rows + rest
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + chance_notes(metrics))


def chance_notes(metrics: Mapping[str, Any]) -> list[str]:
    """One line for every result still at (or below) its baseline, saying what that means here (:data:`AT_CHANCE`
    for the pretraining units, a general line otherwise)."""
    units = _chance_levels()
    notes = []
    for key, value in metrics.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or _is_baseline_key(key, metrics):
            continue
        judged = _judged(key, float(value), metrics)
        if judged is None or math.isnan(float(value)) or judged[3]:
            continue
        unit = units.get(key, (None,))[0]
        why = AT_CHANCE.get(unit) or (
            "the model has not learned this beyond the baseline at this budget: train "
            "longer (--max-steps), or check the data and labels"
        )
        notes.append(f"note: {key} is {float(value):.4f}, at its {judged[1]} baseline {judged[0]:.4f}: {why}.")
    return notes


def _number(value) -> str:
    return str(value) if isinstance(value, int) else f"{value:.4f}"


__all__ = [
    "results_table",
    "chance_notes",
    "baseline_of",
    "verdict",
    "standard_error",
    "MARGIN",
    "Z",
    "LOWER_IS_BETTER",
    "BASELINE_SUFFIXES",
    "SAMPLING_SUFFIXES",
    "AT_CHANCE",
]
