"""GQA questions (Hudson and Manning 2019) as :class:`~vlbert.data.vqa.VQAExample`: one answer per question, so the
VQA task's dataset, head and soft-score loss apply unchanged (a single reference scores 1: LXMERT's GQA targets,
airsplay/lxmert@2249f65 ``src/tasks/gqa_data.py``), and accuracy is the exact match of the answer
(:func:`vlbert.evaluation.vqa.gqa_accuracy`).

Two layouts are read:

* the official balanced-split questions JSON (``{train,val,testdev}_balanced_questions.json``):
  ``{question_id: {"imageId": "2375429", "question": "...", "answer": "pipe", ...}}`` (``answer`` absent in the
  submission split);
* LXMERT's preprocessed ``data/gqa/<split>.json``: ``[{"img_id", "question_id", "sent", "label": {answer: 1.0}}]``
  (``label`` absent in ``submit.json``).
"""

from __future__ import annotations

import os
from pathlib import Path

from vlbert.common.user_files import expect, read_json
from vlbert.data.vqa import VQAExample

_FIX = "write LXMERT's layout, a mapping of each answer to its score"


def _official(values: dict, path) -> list[VQAExample]:
    examples = []
    for qid, record in values.items():
        if not isinstance(record, dict) or "imageId" not in record or "question" not in record:
            raise ValueError(
                f"{path}: question {qid!r} lacks imageId/question; is this a GQA questions file "
                "(balanced split) or LXMERT's gqa/<split>.json?"
            )
        answer = record.get("answer")
        if answer is not None:
            expect(answer, str, f"{path}: question {qid!r}", "field 'answer'", "give one answer as a string")
        examples.append(
            VQAExample(str(qid), str(record["imageId"]), record["question"], (answer,) if answer is not None else ())
        )
    return examples


def _lxmert(values: list, path) -> list[VQAExample]:
    examples = []
    for k, record in enumerate(values):
        if not isinstance(record, dict) or not {"img_id", "question_id", "sent"} <= set(record):
            raise ValueError(f"{path}: record {k} lacks img_id/question_id/sent; is this LXMERT's gqa/<split>.json?")
        label = record.get("label") or {}
        expect(label, dict, f"{path}: record {k}", "field 'label' (answer -> score, e.g. {\"pipe\": 1.0})", _FIX)
        answers = (max(label, key=label.get),) if label else ()  # GQA: one answer, score 1.0
        examples.append(VQAExample(str(record["question_id"]), str(record["img_id"]), record["sent"], answers))
    return examples


def load_gqa(questions_file: str | os.PathLike, image_id_format: str = "{image_id}") -> list[VQAExample]:
    """GQA questions from either layout (see the module docstring); image ids become the shards' ids through
    ``image_id_format`` (``{image_id}``: the GQA / Visual Genome image id as the file writes it).

    Raises:
        FileNotFoundError: no such file. ValueError: not JSON, neither layout, or an answer or label of another
            type (a ``UserFileError``; the file, record and field named).
    """
    path = Path(questions_file)
    values = read_json(path, "GQA questions file", "give a GQA questions file")
    if isinstance(values, dict):
        examples = _official(values, path)
    elif isinstance(values, list):
        examples = _lxmert(values, path)
    else:
        raise ValueError(f"{path} holds neither a GQA questions object nor LXMERT's list of questions")
    return [
        VQAExample(ex.question_id, image_id_format.format(image_id=ex.image_id), ex.question, ex.answers)
        for ex in examples
    ]


__all__ = ["load_gqa"]
