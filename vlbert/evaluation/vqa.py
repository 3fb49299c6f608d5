"""VQA accuracy exactly as the official evaluation computes it today (GT-Vision-Lab/VQA,
``PythonEvaluationTools/vqaEvaluation/vqaEval.py`` at master, commit a013f00; Antol et al. 2015, section 2). The
answer processing it compares through is :mod:`vlbert.data.vqa_answers`, shared with the training targets."""

from __future__ import annotations

from typing import Sequence

from vlbert.data.vqa_answers import prediction_form, reference_forms


def vqa_accuracy(prediction: str, references: Sequence[str]) -> float:
    """Accuracy of one predicted answer against the annotators' answers, as the official evaluation at commit
    a013f00 scores it (the rule and its quirks: :mod:`vlbert.data.vqa_answers`).

    Args:
        prediction: the model's answer, any string.
        references: every annotator's answer, as in the annotation file (10 in VQA v2). With a single reference
            (easy-VQA), a prediction equal to it scores 1 (the official leave-one-out would always give 0).
    Returns:
        float in [0, 1]: the mean over annotators of min(1, matches among the other annotators / 3).
    Raises:
        ValueError: no references.
    """
    if not references:
        raise ValueError("vqa_accuracy needs at least one reference answer")
    refs = reference_forms(references)
    pred = prediction_form(prediction, references)
    if len(refs) == 1:
        return float(pred == refs[0])
    matches = sum(r == pred for r in refs)
    return sum(min(1.0, (matches - (r == pred)) / 3.0) for r in refs) / len(refs)


def gqa_accuracy(prediction: str, answer: str) -> float:
    """GQA accuracy of one question: 1.0 when the predicted answer is exactly the single reference answer, else 0.0
    (Hudson and Manning 2019, section 4; airsplay/lxmert@2249f65 ``src/tasks/gqa_data.py`` ``GQAEvaluator``: the
    label's score of the answer, 1.0 for the one answer)."""
    return float(prediction == answer)


__all__ = ["vqa_accuracy", "gqa_accuracy"]
