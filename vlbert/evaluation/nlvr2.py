"""NLVR2's two figures as its official evaluation script computes them (lil-lab/nlvr@e6a286a
``nlvr2/eval/metrics.py``; Suhr et al. 2019): accuracy (the script prints it as "precision") and
consistency, the share of unique sentences for which every example is predicted correctly.

A sentence of NLVR2 is paired with several image pairs: identifiers ``<split>-<set>-<pair>-<sentence>`` that differ
only in ``<pair>`` are one sentence (the script blanks the third ``-`` field to find them).
"""

from __future__ import annotations

from typing import Sequence


def sentence_key(identifier: str) -> str:
    """The unique sentence of an NLVR2 example: its identifier with the third ``-`` field (the image pair) blanked,
    as metrics.py does (``"dev-850-0-1"`` -> ``"dev-850--1"``). An identifier with fewer than three fields is its
    own sentence."""
    fields = identifier.split("-")
    if len(fields) >= 3:
        fields[2] = ""
    return "-".join(fields)


def nlvr2_scores(identifiers: Sequence[str], correct: Sequence[bool]) -> dict[str, float]:
    """Accuracy and consistency of NLVR2 predictions.

    Args:
        identifiers: each example's NLVR2 identifier (``dev-850-0-0``).
        correct: per example, whether its predicted label equals the gold one.
    Returns:
        ``{"accuracy": correct examples / examples, "consistency": sentences all of whose examples are correct /
        unique sentences (:func:`sentence_key`), "eval_sentences": unique sentences}``; NaN figures for no example.
    Raises:
        ValueError: the two sequences differ in length.
    """
    if len(identifiers) != len(correct):
        raise ValueError(f"{len(identifiers)} identifiers but {len(correct)} correctness values")
    consistent: dict[str, bool] = {}
    for identifier, ok in zip(identifiers, correct, strict=True):
        key = sentence_key(identifier)
        consistent[key] = consistent.get(key, True) and bool(ok)
    n = len(identifiers)
    return {
        "accuracy": sum(map(bool, correct)) / n if n else float("nan"),
        "consistency": sum(consistent.values()) / len(consistent) if consistent else float("nan"),
        "eval_sentences": len(consistent),
    }


__all__ = ["nlvr2_scores", "sentence_key"]
