"""VQA accuracy exactly as the official evaluation computes it today (GT-Vision-Lab/VQA,
``PythonEvaluationTools/vqaEvaluation/vqaEval.py`` at master, commit a013f00; Antol et al. 2015, section 2), GQA
accuracy as GQA's ``eval.py`` computes it, and the two benchmarks' results files, which their official code loads.
The answer processing VQA accuracy compares through is :mod:`vlbert.data.vqa_answers`, shared with the training
targets.

Both official evaluators score every question of the evaluation split: a question whose annotated answers are all
outside the model's answer vocabulary is scored like any other (its predicted answer string against the annotators'
answers: usually 0), never left out (docs/metrics.md).
"""

from __future__ import annotations

import json
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
    (Hudson and Manning 2019, section 4; GQA's ``eval.py``, ``correct = (predicted == gold)``, as in the public copy
    junayednaushad/Relation-Network-VQA@613d4a2 ``gqa/eval.py``, which prints the mean over the balanced questions
    times 100; airsplay/lxmert@2249f65 ``src/tasks/gqa_data.py`` ``GQAEvaluator``: the label's score of the answer,
    1.0 for the one answer)."""
    return float(prediction == answer)


def _int_if_digits(value):
    return int(value) if isinstance(value, str) and value.isdigit() else value


def vqa_results_json(rows: Sequence[dict]) -> str:
    """The VQA v2 results file (the evaluation server's format, which ``VQA.loadRes`` of GT-Vision-Lab/VQA@a013f00
    ``PythonHelperTools/vqaTools/vqa.py`` reads): a JSON array ``[{"question_id": int, "answer": str}]``, one entry
    per row (``rows``: dicts with ``question_id``, an int or a string of digits, kept as given otherwise, and
    ``answer``). ``loadRes`` refuses a file that lacks a question of the annotation file."""
    return json.dumps([{"question_id": _int_if_digits(r["question_id"]), "answer": r["answer"]} for r in rows])


def gqa_predictions_json(rows: Sequence[dict]) -> str:
    """GQA's predictions file (what GQA's ``eval.py`` reads and the challenge takes): a JSON array
    ``[{"questionId": str, "prediction": str}]`` (``rows``: dicts with ``question_id`` and ``answer``; ids as
    strings, as the questions file's keys: airsplay/lxmert@2249f65 ``src/tasks/gqa_data.py``
    ``GQAEvaluator.dump_result``). ``eval.py`` refuses a file that lacks a balanced question."""
    return json.dumps([{"questionId": str(r["question_id"]), "prediction": r["answer"]} for r in rows])


__all__ = ["vqa_accuracy", "gqa_accuracy", "vqa_results_json", "gqa_predictions_json"]
