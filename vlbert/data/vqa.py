"""VQA data: examples from easy-VQA or the VQA v2 JSON files, an answer vocabulary, and batches of question +
regions + soft answer targets."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import torch

from vlbert.common.user_files import UserFileError, expect, read_json
from vlbert.data.easy_vqa import load_questions
from vlbert.data.grounded_text import GroundedTextDataset
from vlbert.data.vqa_answers import answer_targets, reference_forms
from vlbert.detectors.regions import Regions
from vlbert.processing import VLProcessor


@dataclass(frozen=True)
class VQAExample:
    """One question: ``question_id``, ``image_id`` (as in the region shards), ``question`` and the annotators'
    ``answers`` (10 in VQA v2, 1 in easy-VQA; empty for unlabelled test questions)."""

    question_id: str
    image_id: str
    question: str
    answers: tuple[str, ...]


def easy_vqa_examples(split: str) -> list[VQAExample]:
    """easy-VQA questions of ``split`` as :class:`VQAExample` (image ids "<split>/<n>", one answer each)."""
    return [
        VQAExample(f"{split}-{k}", q.image_id, q.question, (q.answer,)) for k, q in enumerate(load_questions(split))
    ]


def load_vqa_v2(
    questions_file: str | os.PathLike,
    annotations_file: str | os.PathLike | None = None,
    image_id_format: str = "{image_id}",
) -> list[VQAExample]:
    """Read the official VQA v2 files (``v2_OpenEnded_mscoco_<split>_questions.json`` and, for train/val,
    ``v2_mscoco_<split>_annotations.json``).

    Args:
        image_id_format: how a numeric COCO image id becomes the id used in the region shards, e.g.
            ``"COCO_train2014_{image_id:012d}"``.
    Raises:
        FileNotFoundError: a file is missing. ValueError: the files lack the expected keys, a record's field is
            missing or of another type (a ``UserFileError``: the file, record and field named), an annotation refers
            to an unknown question, or (with annotations) a question has no annotation.
    """
    questions = read_json(questions_file, "VQA v2 questions file")
    if not isinstance(questions, dict) or "questions" not in questions:
        raise ValueError(f"{questions_file} has no 'questions' list; is it a VQA v2 questions file?")
    records = expect(questions["questions"], list, str(questions_file), "field 'questions'")
    for k, q in enumerate(records):
        _record(
            q,
            f"{questions_file}: record {k} of 'questions'",
            {"question_id": (int, str), "image_id": (int, str), "question": str},
        )
    if annotations_file is None:
        return [_example(q, (), image_id_format) for q in records]
    answers = _annotated_answers(annotations_file)
    known = {q["question_id"] for q in records}
    stray = [qid for qid in answers if qid not in known]
    if stray:
        raise ValueError(
            f"{annotations_file} annotates {len(stray)} questions not in {questions_file}, "
            f"e.g. {stray[:3]}; pair files of the same split"
        )
    bare = [(k, q["question_id"]) for k, q in enumerate(records) if q["question_id"] not in answers]
    if bare:  # it would be trained on as all-zero targets, or scored against no answer
        k, qid = bare[0]
        raise ValueError(
            f"{questions_file}: record {k} of 'questions' (question_id {qid}) has no annotation in {annotations_file}"
            f" ({len(bare)} questions have none); pair the questions and annotations files of the same split"
        )
    return [_example(q, answers[q["question_id"]], image_id_format) for q in records]


def _record(value, where: str, fields: dict[str, type | tuple[type, ...]]) -> dict:
    """``value`` checked as a mapping holding ``fields`` (name -> type), each named where missing or mistyped."""
    expect(value, dict, where, "the record")
    for name, kind in fields.items():
        if name not in value:
            raise UserFileError(f"{where}: the record has no field {name!r} (fields: {sorted(value)})")
        expect(value[name], kind, where, f"field {name!r}")
    return value


def _annotated_answers(annotations_file) -> dict[int, tuple[str, ...]]:
    """question id -> the annotators' answers, from a VQA v2 annotations file (each record's fields checked)."""
    annotations = read_json(annotations_file, "VQA v2 annotations file")
    if not isinstance(annotations, dict) or "annotations" not in annotations:
        raise ValueError(f"{annotations_file} has no 'annotations' list; is it a VQA v2 annotations file?")
    out = {}
    for k, a in enumerate(expect(annotations["annotations"], list, str(annotations_file), "field 'annotations'")):
        where = f"{annotations_file}: record {k} of 'annotations'"
        _record(a, where, {"question_id": (int, str), "answers": list})
        for i, x in enumerate(a["answers"]):
            _record(x, f"{where}, answers[{i}]", {"answer": str})
        out[a["question_id"]] = tuple(x["answer"] for x in a["answers"])
    return out


def _example(q: dict, answers: tuple[str, ...], image_id_format: str) -> VQAExample:
    return VQAExample(str(q["question_id"]), image_id_format.format(image_id=q["image_id"]), q["question"], answers)


def build_answer_vocab(examples: Sequence[VQAExample], min_count: int = 1) -> list[str]:
    """Answers given at least ``min_count`` times (VQA v2 practice: 9, giving 3,129 answers), most frequent first,
    each in the form the official evaluation compares (:func:`~vlbert.data.vqa_answers.reference_forms`: processed
    where a question's annotators disagree, as given where they agree)."""
    counts = Counter(a for ex in examples for a in reference_forms(ex.answers))
    return [a for a, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if c >= min_count]


#: what :class:`VQADataset` does with a question none of whose answers is in the vocabulary.
UNKNOWN_QUESTIONS = ("error", "drop", "keep")


class VQADataset(GroundedTextDataset):
    """Questions joined with their image's regions and soft answer targets.

    Items: as :class:`~vlbert.data.grounded_text.GroundedTextDataset`, the target ``answer_targets`` float32 [A]
    (each vocabulary answer's soft score, :func:`~vlbert.data.vqa_answers.answer_targets`; zeros for a question
    without answers or without an answer in the vocabulary).

    Args:
        examples: the questions.
        regions: image id -> :class:`~vlbert.detectors.regions.Regions`.
        processor: the run's processor (:class:`~vlbert.data.grounded_text.GroundedTextDataset`).
        answer_vocab: the answers the model can output.
        unknown: what becomes of a labelled question none of whose answers is in the vocabulary (an
            *unanswerable* question): ``"error"`` (refused), ``"drop"`` (left out: for training, where such a
            question has no target to learn) or ``"keep"`` (kept with all-zero targets: for evaluation, where the
            official evaluators score every question and such a question scores what its predicted answer string
            earns against the annotators' answers, usually 0).
    Attributes:
        unanswerable: how many unanswerable questions were kept (``"keep"``) or dropped (``"drop"``).
    Raises:
        ValueError: a question's image has no regions; with ``unknown="error"``, an unanswerable question (the
            message names the question and the fix); an ``unknown`` other than the three.
    """

    kind, id_field, text_field = "question", "question_id", "question"

    def __init__(
        self,
        examples: Sequence[VQAExample],
        regions: dict[str, Regions],
        processor: VLProcessor,
        answer_vocab: Sequence[str],
        unknown: str = "error",
    ):
        if unknown not in UNKNOWN_QUESTIONS:
            raise ValueError(f"unknown must be one of {', '.join(map(repr, UNKNOWN_QUESTIONS))}, got {unknown!r}")
        self.answer_to_index = {a: i for i, a in enumerate(answer_vocab)}
        self.answer_vocab = list(answer_vocab)
        kept, self.unanswerable = [], 0
        for ex in examples:
            if ex.answers and not answer_targets(ex.answers, self.answer_to_index):
                if unknown == "error":
                    raise ValueError(
                        f"question {ex.question_id} ({ex.question!r}) has answers "
                        f"{list(ex.answers)[:3]} none of which is in the {len(answer_vocab)}-answer "
                        "vocabulary; extend the vocabulary, or pass unknown='drop' (training) or "
                        "unknown='keep' (evaluation)"
                    )
                self.unanswerable += 1
                if unknown == "drop":
                    continue
            kept.append(ex)
        super().__init__(kept, regions, processor)

    def targets(self, example, regions) -> dict:
        scores = torch.zeros(len(self.answer_vocab))
        for j, score in answer_targets(example.answers, self.answer_to_index).items():
            scores[j] = score
        return {"answer_targets": scores}


__all__ = ["VQAExample", "easy_vqa_examples", "load_vqa_v2", "build_answer_vocab", "VQADataset", "UNKNOWN_QUESTIONS"]
