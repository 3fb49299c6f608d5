"""Text task metrics: accuracy, macro-F1, Pearson correlation, entity-level F1 for BIO tagging (CoNLL), and
SQuAD exact match / F1 (Rajpurkar et al. 2016)."""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Sequence


def accuracy(predictions: Sequence, references: Sequence) -> float:
    """Share of equal pairs."""
    if len(predictions) != len(references) or not references:
        raise ValueError("accuracy needs equally many predictions and references, at least one")
    return sum(p == r for p, r in zip(predictions, references)) / len(references)


def macro_f1(predictions: Sequence[int], references: Sequence[int]) -> float:
    """Unweighted mean over the reference classes of per-class F1."""
    scores = []
    for c in sorted(set(references)):
        tp = sum(p == c and r == c for p, r in zip(predictions, references))
        fp = sum(p == c and r != c for p, r in zip(predictions, references))
        fn = sum(p != c and r == c for p, r in zip(predictions, references))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(scores) / len(scores)


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation coefficient (STS-B's metric); 0 when either side is constant."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else 0.0


def bio_spans(tags: Sequence[str]) -> set[tuple[int, int, str]]:
    """Entity spans (start, end exclusive, type) of a BIO (IOB2) tag sequence; an I- tag without a matching
    open entity starts one (conlleval's lenient reading)."""
    spans, start, kind = set(), None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, _, label = tag.partition("-")
        if start is not None and (prefix != "I" or label != kind):
            spans.add((start, i, kind))
            start, kind = None, None
        if prefix == "B" or (prefix == "I" and start is None):
            start, kind = i, label
    return spans


def entity_f1(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> float:
    """Micro-averaged entity-level F1 over sentences of BIO tags (CoNLL-2003's metric)."""
    tp = fp = fn = 0
    for p, r in zip(predictions, references):
        ps, rs = bio_spans(p), bio_spans(r)
        tp, fp, fn = tp + len(ps & rs), fp + len(ps - rs), fn + len(rs - ps)
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def normalize_squad_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def squad_scores(prediction: str, references: Sequence[str]) -> tuple[float, float]:
    """(exact match, token F1) of one answer, each the maximum over the reference answers."""
    pred = normalize_squad_answer(prediction)
    best_em = best_f1 = 0.0
    for ref in references or [""]:
        gold = normalize_squad_answer(ref)
        best_em = max(best_em, float(pred == gold))
        p_tokens, g_tokens = pred.split(), gold.split()
        common = sum((Counter(p_tokens) & Counter(g_tokens)).values())
        if not p_tokens or not g_tokens:
            f1 = float(p_tokens == g_tokens)
        elif common == 0:
            f1 = 0.0
        else:
            precision, recall = common / len(p_tokens), common / len(g_tokens)
            f1 = 2 * precision * recall / (precision + recall)
        best_f1 = max(best_f1, f1)
    return best_em, best_f1


__all__ = ["accuracy", "macro_f1", "pearson", "bio_spans", "entity_f1", "squad_scores", "normalize_squad_answer"]
