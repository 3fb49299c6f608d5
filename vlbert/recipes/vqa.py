"""VQA fine-tuning (``vlbert finetune --task vqa``): :class:`~vlbert.models.vqa.VLBertForVQA` on question + regions,
soft-score binary cross-entropy, and the official VQA accuracy over every question of the evaluation split.

Datasets: ``easy-vqa`` (embedded: regions extracted into the same cached shards as VL pretraining),
``vqa-v2`` (the official question/annotation JSON files plus region shards you extracted or imported) and ``gqa``
(GQA's balanced-split questions JSON or LXMERT's ``gqa/<split>.json``, :func:`~vlbert.data.gqa.load_gqa`; one
answer per question, scored by exact match: ``gqa_accuracy``).

Training leaves out the questions none of whose answers is in the answer vocabulary (vqa-v2, gqa: they have no
target); the evaluation keeps them, as the official evaluators do, and scores each by its predicted answer string
(usually 0). The metrics say how many questions were evaluated (``eval_questions``) and how many of them had no
answer in the vocabulary (``eval_unanswerable``); the benchmark's own results file (:data:`RESULTS_FILES`) is
written beside ``predictions.jsonl`` for its official evaluation code.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from vlbert.data.easy_vqa import answers as easy_vqa_answers
from vlbert.data.easy_vqa import first_images
from vlbert.data.gqa import load_gqa
from vlbert.data.vqa import VQADataset, build_answer_vocab, easy_vqa_examples, load_vqa_v2
from vlbert.data.vqa_answers import reference_forms
from vlbert.evaluation.vqa import gqa_accuracy, gqa_predictions_json, vqa_accuracy, vqa_results_json
from vlbert.models.vqa import VLBertForVQA
from vlbert.recipes.init_from import load_model
from vlbert.recipes.regions import (
    Count,
    DatasetBuilder,
    RegionTaskData,
    RegionTaskDataConfig,
    TextLength,
    task_regions,
)
from vlbert.recipes.report import standard_error
from vlbert.recipes.runner import Recipe, RunContext, write_output_file

logger = logging.getLogger(__name__)


@dataclass
class VQADataConfig(RegionTaskDataConfig):
    """VQA data (YAML section ``data``): :class:`RegionTaskDataConfig` (dataset "easy-vqa" or "vqa-v2") and, for
    vqa-v2, the official train/eval question and annotation files (``image_id_format`` maps the numeric COCO id to
    the shards' id). min_answer_count: answers given fewer times in training are left out of the vocabulary (VQA
    v2: 9). max_text_length: of a question. max_train_images: train on the questions of the first N training images
    only (in the order of their first question; easy-VQA: "train/0" ... "train/<N-1>", whose regions VL pretraining
    with ``data.max_images: N`` extracts too; 0 = all); the evaluation keeps every question.
    """

    train_questions: str = ""
    train_annotations: str = ""
    eval_questions: str = ""
    eval_annotations: str = ""
    min_answer_count: Count = 1
    max_text_length: TextLength = 32
    max_train_images: Count = 0


def first_images_questions(examples: list, count: int) -> list:
    """The examples about the first ``count`` images (in the order of each image's first example; 0 = all)."""
    if not count:
        return examples
    images = set(list(dict.fromkeys(ex.image_id for ex in examples))[:count])
    return [ex for ex in examples if ex.image_id in images]


def _easy_vqa(data: VQADataConfig, seed: int):
    train = first_images_questions(easy_vqa_examples("train"), data.max_train_images)
    return train, easy_vqa_examples("test"), easy_vqa_answers(), False


def _vqa_v2(data: VQADataConfig, seed: int):
    train = load_vqa_v2(data.train_questions, data.train_annotations or None, data.image_id_format)
    train = first_images_questions(train, data.max_train_images)
    held_out = load_vqa_v2(data.eval_questions, data.eval_annotations or None, data.image_id_format)
    return train, held_out, build_answer_vocab(train, data.min_answer_count), True


def _gqa(data: VQADataConfig, seed: int):
    train = first_images_questions(load_gqa(data.train_questions, data.image_id_format), data.max_train_images)
    held_out = load_gqa(data.eval_questions, data.image_id_format)
    return train, held_out, build_answer_vocab(train, data.min_answer_count), True


#: dataset name -> (train, eval, answer vocabulary, drop training questions without an answer in the vocabulary).
DATASETS = {
    "easy-vqa": DatasetBuilder(_easy_vqa),
    "vqa-v2": DatasetBuilder(_vqa_v2, needs=("train_questions", "eval_questions", "shards")),
    "gqa": DatasetBuilder(_gqa, needs=("train_questions", "eval_questions", "shards")),
}
#: how a dataset scores one answer: (metric name, fn(prediction, reference answers)); default VQA accuracy.
SCORES = {"gqa": ("gqa_accuracy", lambda answer, references: gqa_accuracy(answer, references[0]))}
#: dataset -> (file name, rows -> text): the benchmark's results file, written beside predictions.jsonl for its
#: official evaluation code (VQA v2: ``VQA.loadRes`` + ``VQAEval``; GQA: ``eval.py --predictions``).
RESULTS_FILES = {
    "vqa-v2": ("vqa_results.json", vqa_results_json),
    "gqa": ("gqa_predictions.json", gqa_predictions_json),
}


class VQAData(RegionTaskData):
    """Training and evaluation questions with regions (:class:`~vlbert.recipes.regions.RegionTaskData`), and the
    answer vocabulary (the dataset builder's third value; its fourth: drop training questions without a known
    answer).

    Raises:
        ValueError: an unknown dataset, or vqa-v2 without its files; errors of :class:`VQADataset`.
    """

    datasets, dataset_class, target_keys = DATASETS, VQADataset, ("answer_targets",)

    @property
    def answer_vocab(self) -> list[str]:
        return self.extra[0]

    def load_regions(self, ctx):
        """The shards' regions, or the easy-VQA images the run reads, extracted and cached: the first
        ``data.max_train_images`` training images (the same cache as VL pretraining's ``data.max_images``) and
        every test image, whatever ``max_eval_examples`` is (one test cache for every run)."""
        if ctx.data.dataset != "easy-vqa" or ctx.data.shards:
            return task_regions(ctx)
        return task_regions(ctx, first_images("train", ctx.data.max_train_images) + first_images("test"))

    def dataset(self, examples: list, training: bool) -> VQADataset:
        """Training: questions without an answer in the vocabulary are dropped (vqa-v2, gqa) or refused (easy-VQA,
        whose vocabulary is every answer); evaluation: every question is kept (``VQADataset(unknown="keep")``)."""
        unknown = "keep" if not training else "drop" if self.extra[1] else "error"
        return VQADataset(examples, self.regions, self.processor, self.answer_vocab, unknown=unknown)

    def predict(self, model) -> tuple[list[dict], dict[str, float]]:
        """(the top answer for every evaluation question, with its accuracy when answers are known; the metrics).

        Metrics: ``vqa_accuracy`` (``gqa_accuracy`` for GQA: :data:`SCORES`), the mean over every question with
        annotated answers, those without an answer in the vocabulary included (the official evaluators' figure;
        they print it times 100); ``eval_questions`` (questions predicted), ``eval_unanswerable`` (of them, those
        none of whose answers is in the vocabulary); ``<metric>_n`` and ``<metric>_stderr``, the scored questions
        and the standard error of their mean (:func:`~vlbert.recipes.report.standard_error`). NaN accuracy (and no
        standard error) when no question has answers (a test split)."""
        metric, score = SCORES.get(self.data.dataset, ("vqa_accuracy", vqa_accuracy))
        rows = []
        for i, a in zip(*self.predict_labels(model)[::2], strict=True):
            ex = self.eval.examples[i]
            row = {"question_id": ex.question_id, "question": ex.question, "answer": self.answer_vocab[a]}
            if ex.answers:
                row["accuracy"] = score(row["answer"], ex.answers)
            rows.append(row)
        scored = [r["accuracy"] for r in rows if "accuracy" in r]
        value = sum(scored) / len(scored) if scored else float("nan")
        logger.info(
            "%s %.4f over %d questions (%d of them with no answer in the %d-answer vocabulary, scored as the "
            "official evaluation scores them)",
            metric,
            value,
            len(scored),
            self.eval.unanswerable,
            len(self.answer_vocab),
        )
        counts = {"eval_questions": len(rows), "eval_unanswerable": self.eval.unanswerable}
        return rows, {metric: value, **standard_error(metric, scored), **counts}


def evaluate(ctx: RunContext, data: VQAData, model) -> dict:
    """The final evaluation (:func:`vlbert.recipes.regions.evaluate`'s shape): the metrics of ``data.predict``, its
    rows in ``predictions.jsonl`` and, for a benchmark (:data:`RESULTS_FILES`), in the benchmark's results file."""
    rows, metrics = data.predict(model)
    write_output_file(ctx, data.predictions_file, data.predictions_text(rows))
    if ctx.data.dataset in RESULTS_FILES:
        name, render = RESULTS_FILES[ctx.data.dataset]
        write_output_file(ctx, name, render(rows))
    return metrics


def build_model(ctx: RunContext, data: VQAData) -> VLBertForVQA:
    return load_model(VLBertForVQA, ctx, num_labels=len(data.answer_vocab), region_feature_dim=data.feature_dim)


def majority_baseline(ctx: RunContext, data: VQAData, model) -> dict:
    """Accuracy (the dataset's: :data:`SCORES`) of always giving the most frequent training answer (the usual prior
    baseline), over every evaluation question with answers."""
    metric, score = SCORES.get(ctx.data.dataset, ("vqa_accuracy", vqa_accuracy))
    counts = Counter(a for ex in data.train.examples for a in reference_forms(ex.answers))
    answer = counts.most_common(1)[0][0]
    scored = [score(answer, ex.answers) for ex in data.eval.examples if ex.answers]
    return {f"{metric}_majority_baseline": sum(scored) / len(scored)} if scored else {}


def processor_fields(ctx: RunContext, data: VQAData) -> dict:
    """The processor's label names: the answer vocabulary (the model's output order)."""
    return {"labels": list(data.answer_vocab)}


RECIPE = Recipe(
    "vqa",
    VQADataConfig,
    VQAData,
    build_model,
    evaluate=evaluate,
    baselines=majority_baseline,
    uses_regions=True,
    processor_fields=processor_fields,
)

__all__ = ["RECIPE", "VQADataConfig", "VQAData", "RESULTS_FILES", "evaluate"]
