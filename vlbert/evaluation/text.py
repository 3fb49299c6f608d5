"""Text task metrics, each the field's own definition: classification and correlation metrics from scikit-learn and
scipy (as GLUE's evaluation computes them), entity F1 from seqeval in its default (conlleval) mode, and SQuAD v1.1 /
v2.0 exact match and F1 restated from the official evaluation scripts.

Sources (read at these commits; docs/metrics.md "Text tasks" lists the tests against each):

* GLUE: huggingface/evaluate@3a62fc3f6f6722ca17f8a6a7b04d9cae9a6c4286 ``metrics/glue/glue.py``: cola ->
  ``matthews_correlation`` (sklearn ``matthews_corrcoef``), stsb -> ``pearson`` and ``spearmanr`` (scipy
  ``pearsonr``/``spearmanr``), mrpc/qqp -> ``accuracy`` and ``f1`` (sklearn ``f1_score``, positive class 1),
  sst2/mnli/qnli/rte/wnli -> ``accuracy``.
* SQuAD v1.1: the official ``evaluate-v1.1.py`` as copied in
  huggingface/evaluate@b6e7c3b0ed02444f1b3f4f1eb48a39f27af321ec ``metrics/squad/compute_score.py``.
* SQuAD v2.0: the official ``evaluate-v2.0.py`` as copied in
  huggingface/datasets@02bb18c7f9899b206983480b14bc1accf69714a5 ``metrics/squad_v2/evaluate.py``.
* conlleval: chakki-works/seqeval@77e3d636793885cfa725a4bf2c776e818d789816 ``tests/conlleval.pl`` (seqeval's default
  mode is tested against it there).

An undefined correlation is nan with one warning line saying why, never 0. Where the benchmark's own evaluation gives a
number for an undefined case (scikit-learn's 0.0 for a Matthews correlation or an F1 with no positive example, which
GLUE's evaluation reports), that number is kept and one warning line says so.
"""

from __future__ import annotations

import logging
import math
import re
import string
import warnings
from collections import Counter
from typing import Any, Mapping, Sequence

logger = logging.getLogger(__name__)

#: GLUE's metric names per task (huggingface/evaluate ``metrics/glue/glue.py``; the GLUE paper's table 1).
GLUE_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews_correlation",),
    "sst2": ("accuracy",),
    "mrpc": ("accuracy", "f1"),
    "qqp": ("accuracy", "f1"),
    "stsb": ("pearson", "spearmanr"),
    "mnli": ("accuracy",),
    "mnli_matched": ("accuracy",),
    "mnli_mismatched": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
}


def _pair(predictions: Sequence, references: Sequence, what: str) -> None:
    if len(predictions) != len(references) or not references:
        raise ValueError(
            f"{what} needs equally many predictions and references, at least one "
            f"(got {len(predictions)} and {len(references)})"
        )


def accuracy(predictions: Sequence, references: Sequence) -> float:
    """Share of predictions equal to their reference (sklearn ``accuracy_score``; GLUE's ``simple_accuracy``).

    Args: predictions, references: equally long sequences of labels (ints or strings). Returns a float in [0, 1].
    Raises: ValueError: unequal lengths or no reference.
    """
    from sklearn.metrics import accuracy_score

    _pair(predictions, references, "accuracy")
    return float(accuracy_score(list(references), list(predictions)))


def macro_f1(predictions: Sequence, references: Sequence, labels: Sequence) -> float:
    """Unweighted mean of per-class F1 over the task's whole label set ``labels`` (sklearn
    ``f1_score(average="macro", labels=labels)``): a class that is predicted but never a reference, or absent from
    both, counts with its F1 of 0 (references [0, 0, 0], predictions [0, 1, 0], labels [0, 1]: 0.4).

    Raises: ValueError: unequal lengths or no reference.
    """
    from sklearn.exceptions import UndefinedMetricWarning
    from sklearn.metrics import f1_score

    _pair(predictions, references, "macro_f1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UndefinedMetricWarning)
        value = float(f1_score(list(references), list(predictions), labels=list(labels), average="macro"))
    absent = sorted({str(c) for c in labels} - {str(c) for c in (*predictions, *references)})
    if any(issubclass(w.category, UndefinedMetricWarning) for w in caught):
        logger.warning(
            "macro_f1: class(es) %s occur in neither predictions nor references; their F1 is undefined "
            "and counts as 0 (scikit-learn's zero_division)",
            absent or "(some)",
        )
    return value


def binary_f1(predictions: Sequence[int], references: Sequence[int], positive: int = 1) -> float:
    """F1 of the ``positive`` class (sklearn ``f1_score``; GLUE's ``f1`` for MRPC and QQP, positive class 1:
    "equivalent" / "duplicate"). No positive prediction nor reference: 0.0 (scikit-learn's value, reported by GLUE's
    evaluation) with one warning line.

    Raises: ValueError: unequal lengths or no reference.
    """
    from sklearn.metrics import f1_score

    _pair(predictions, references, "f1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one line below instead of scikit-learn's
        value = float(f1_score(list(references), list(predictions), pos_label=positive, zero_division=0.0))
    if positive not in predictions and positive not in references:
        logger.warning(
            "f1 is undefined: no prediction and no reference is the positive class %r; reported as 0.0, "
            "scikit-learn's value, which GLUE's evaluation reports",
            positive,
        )
    return value


def matthews_correlation(predictions: Sequence, references: Sequence) -> float:
    """Matthews correlation coefficient (sklearn ``matthews_corrcoef``; GLUE's CoLA metric), in [-1, 1]. Constant
    predictions or references make it undefined: scikit-learn (and so GLUE's evaluation) reports 0.0; kept, with
    one warning line.

    Raises: ValueError: unequal lengths or no reference.
    """
    from sklearn.metrics import matthews_corrcoef

    _pair(predictions, references, "matthews_correlation")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = float(matthews_corrcoef(list(references), list(predictions)))
    constant = [name for name, x in (("predictions", predictions), ("references", references)) if len(set(x)) < 2]
    if constant:
        logger.warning(
            "matthews_correlation is undefined: the %s are constant; reported as 0.0, scikit-learn's "
            "value, which GLUE's evaluation reports",
            " and the ".join(constant),
        )
    return value


def pearson_and_spearman(predictions: Sequence[float], references: Sequence[float]) -> dict[str, float]:
    """``{"pearson", "spearmanr"}``: scipy's ``pearsonr`` and ``spearmanr`` statistics (GLUE's STS-B metrics).
    A constant side (or fewer than 2 pairs) leaves both undefined: nan, with one warning line naming the cause.

    Raises: ValueError: unequal lengths or no reference.
    """
    import numpy as np
    from scipy import stats

    _pair(predictions, references, "pearson")
    x, y = np.asarray(predictions, dtype=np.float64), np.asarray(references, dtype=np.float64)
    constant = [
        f"the {name} are constant (every one {v[0]:g})"
        for name, v in (("predictions", x), ("references", y))
        if len(v) >= 2 and np.all(v == v[0])
    ]
    if len(x) < 2 or constant:
        why = " and ".join(constant) if constant else f"{len(x)} pair: a correlation needs at least 2"
        logger.warning("pearson and spearmanr are undefined (nan): %s", why)
        return {"pearson": math.nan, "spearmanr": math.nan}
    return {"pearson": float(stats.pearsonr(x, y).statistic), "spearmanr": float(stats.spearmanr(x, y).statistic)}


def glue_metrics(task: str, predictions: Sequence, references: Sequence) -> dict[str, float]:
    """GLUE's metrics of ``task`` under GLUE's names (:data:`GLUE_METRICS`): label indices (ints, GLUE's label
    order) for the classification tasks, scores for stsb.

    Raises: ValueError: an unknown task (the known ones named), unequal lengths.
    """
    if task not in GLUE_METRICS:
        raise ValueError(f"unknown GLUE task {task!r}; GLUE's tasks are {sorted(GLUE_METRICS)}")
    names = GLUE_METRICS[task]
    if names == ("pearson", "spearmanr"):
        return pearson_and_spearman(predictions, references)
    out = {}
    for name in names:
        out[name] = {"accuracy": accuracy, "f1": binary_f1, "matthews_correlation": matthews_correlation}[name](
            predictions, references
        )
    return out


def entity_f1(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> float:
    """Micro-averaged entity F1 over sentences of IOB tags: seqeval's ``f1_score`` in its default mode, which
    reads chunks as conlleval does (an I- tag after O or after another type starts a chunk; CoNLL-2003's metric).
    Returns a float in [0, 1] (conlleval prints it x 100).

    Raises: ValueError: a sentence whose predicted and reference tags differ in number.
    """
    from seqeval.metrics import f1_score

    _sentences(predictions, references)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval's "tag seems not to be NE tag" for non-IOB tags
        return float(f1_score([list(r) for r in references], [list(p) for p in predictions]))


def tag_accuracy(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> float:
    """Share of words whose predicted tag equals the reference (seqeval ``accuracy_score``; conlleval's
    "accuracy").

    Raises: ValueError: a sentence whose predicted and reference tags differ in number.
    """
    from seqeval.metrics import accuracy_score

    _sentences(predictions, references)
    return float(accuracy_score([list(r) for r in references], [list(p) for p in predictions]))


def _sentences(predictions, references) -> None:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predicted sentences but {len(references)} references")
    for k, (p, r) in enumerate(zip(predictions, references, strict=True)):
        if len(p) != len(r):
            raise ValueError(f"sentence {k}: {len(p)} predicted tags but {len(r)} reference tags")


def normalize_squad_answer(text: str) -> str:
    """SQuAD's answer normalisation (both official scripts' ``normalize_answer``): lower case, punctuation
    removed, the articles a/an/the removed, whitespace collapsed to single spaces."""
    exclude = set(string.punctuation)
    text = "".join(ch for ch in text.lower() if ch not in exclude)
    text = re.sub(r"\b(a|an|the)\b", " ", text, flags=re.UNICODE)
    return " ".join(text.split())


def _token_f1(prediction_tokens: list[str], gold_tokens: list[str]) -> float:
    common = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(prediction_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_v1_scores(prediction: str, ground_truths: Sequence[str]) -> tuple[float, float]:
    """(exact match, F1) of one answer as ``evaluate-v1.1.py`` scores it: each the maximum over every gold answer
    (none dropped); F1 is 0 whenever no token is shared, so 0 when prediction and gold both normalise to nothing
    (exact match is then 1).

    Raises: ValueError: no gold answer (the official script fails on one: SQuAD v1.1 has none).
    """
    if not ground_truths:
        raise ValueError(
            "a SQuAD v1.1 question needs at least one gold answer (unanswerable questions are "
            "SQuAD 2.0: data.version_2_with_negative: true)"
        )
    pred = normalize_squad_answer(prediction)
    em = max(float(pred == normalize_squad_answer(g)) for g in ground_truths)
    f1 = max(_token_f1(pred.split(), normalize_squad_answer(g).split()) for g in ground_truths)
    return em, f1


def squad_v1_evaluate(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """``{"exact_match", "f1"}`` in percent over every question of ``references`` (question id -> gold answer
    texts), as ``evaluate-v1.1.py``'s ``evaluate``: a question without a prediction scores 0.

    Raises: ValueError: no reference, or a question without gold answers.
    """
    if not references:
        raise ValueError("no question to evaluate")
    em = f1 = 0.0
    for qid, golds in references.items():
        if qid in predictions:
            e, f = squad_v1_scores(predictions[qid], golds)
            em, f1 = em + e, f1 + f
    return {"exact_match": 100.0 * em / len(references), "f1": 100.0 * f1 / len(references)}


def squad_v2_scores(prediction: str, ground_truths: Sequence[str]) -> tuple[float, float]:
    """(exact, F1) of one answer as ``evaluate-v2.0.py``'s ``get_raw_scores``: gold answers that normalise to
    nothing are dropped, and with none left the only right answer is the empty string ("no answer"); F1 is 1 when
    prediction and gold are both empty, 0 when one of them is."""
    golds = [g for g in ground_truths if normalize_squad_answer(g)] or [""]
    pred = normalize_squad_answer(prediction)
    exact = max(float(pred == normalize_squad_answer(g)) for g in golds)
    f1 = 0.0
    for g in golds:
        p_tokens, g_tokens = pred.split(), normalize_squad_answer(g).split()
        f1 = max(f1, float(p_tokens == g_tokens) if not p_tokens or not g_tokens else _token_f1(p_tokens, g_tokens))
    return exact, f1


def best_threshold(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_answer: Mapping[str, bool],
) -> tuple[float, float]:
    """(best score in percent, its threshold) over no-answer thresholds, as ``evaluate-v2.0.py``'s
    ``find_best_thresh``: start from answering nothing (every unanswerable question right), then answer questions in
    increasing ``na_probs`` order, each answerable one adding its raw score and each unanswerable one with a
    non-empty prediction taking 1 away; the threshold is the ``na_probs`` value where the running score was last
    strictly best (0.0 if answering nothing is best). ``has_answer``: question id -> it has gold answers (the
    official ``make_qid_to_has_ans``: any gold answer, normalising to nothing or not)."""
    current = best = sum(1 for v in has_answer.values() if not v)
    threshold = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        current += scores[qid] if has_answer[qid] else (-1 if predictions[qid] else 0)
        if current > best:
            best, threshold = current, na_probs[qid]
    return 100.0 * best / len(scores), threshold


def squad_v2_evaluate(
    predictions: Mapping[str, str],
    references: Mapping[str, Sequence[str]],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, Any]:
    """``evaluate-v2.0.py``'s output for ``predictions`` (question id -> answer text, "" for no answer) over
    ``references`` (question id -> gold answer texts, empty for an unanswerable question), in percent:
    ``exact``, ``f1``, ``total``; ``HasAns_exact/f1/total`` and ``NoAns_exact/f1/total`` where there are such
    questions; with ``na_probs`` (question id -> no-answer score), answers whose score exceeds ``na_prob_thresh``
    count as "no answer", and ``best_exact``, ``best_exact_thresh``, ``best_f1``, ``best_f1_thresh``
    (:func:`best_threshold`).

    Raises: ValueError: no reference, or a question without a prediction (the script's HasAns/NoAns figures fail on
        one).
    """
    missing = [qid for qid in references if qid not in predictions]
    if not references or missing:
        raise ValueError(
            f"every question needs a prediction; {len(missing)} of {len(references)} have none (first: {missing[:3]})"
            if missing
            else "no question to evaluate"
        )
    has_answer = {qid: bool(golds) for qid, golds in references.items()}
    exact_raw, f1_raw = {}, {}
    for qid, golds in references.items():
        exact_raw[qid], f1_raw[qid] = squad_v2_scores(predictions[qid], golds)
    probs = na_probs if na_probs is not None else {qid: 0.0 for qid in predictions}

    def thresholded(raw):
        return {qid: float(not has_answer[qid]) if probs[qid] > na_prob_thresh else s for qid, s in raw.items()}

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)

    def figures(qids, prefix=""):
        return {
            f"{prefix}exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
            f"{prefix}f1": 100.0 * sum(f1[q] for q in qids) / len(qids),
            f"{prefix}total": len(qids),
        }

    out = figures(list(exact))
    # The official script's qid lists are over every reference question (make_eval_dict with qid_list).
    for prefix, want in (("HasAns_", True), ("NoAns_", False)):
        qids = [q for q, v in has_answer.items() if v is want]
        if qids:
            out.update(figures(qids, prefix))
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = best_threshold(predictions, exact_raw, na_probs, has_answer)
        out["best_f1"], out["best_f1_thresh"] = best_threshold(predictions, f1_raw, na_probs, has_answer)
    return out


__all__ = [
    "GLUE_METRICS",
    "accuracy",
    "macro_f1",
    "binary_f1",
    "matthews_correlation",
    "pearson_and_spearman",
    "glue_metrics",
    "entity_f1",
    "tag_accuracy",
    "normalize_squad_answer",
    "squad_v1_scores",
    "squad_v1_evaluate",
    "squad_v2_scores",
    "best_threshold",
    "squad_v2_evaluate",
]
