"""VQA fine-tuning (``tools/finetune_vqa.py``): :class:`~vlbert.models.vqa.VLBertForVQA` on question + regions,
soft-score binary cross-entropy, and the official VQA accuracy on the evaluation split.

Datasets: ``easy-vqa`` (embedded: regions extracted into the same cached shards as VL pretraining) and
``vqa-v2`` (the official question/annotation JSON files plus region shards you extracted or imported).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

from vlbert.data.easy_vqa import answers as easy_vqa_answers
from vlbert.data.vqa import VQACollator, VQADataset, build_answer_vocab, easy_vqa_examples, load_vqa_v2
from vlbert.data.vqa_answers import reference_forms
from vlbert.evaluation.vqa import vqa_accuracy
from vlbert.models.vqa import VLBertForVQA
from vlbert.recipes.regions import DatasetBuilder, RegionTaskDataConfig, load_examples, region_task_info, task_regions
from vlbert.recipes.runner import Recipe, RunContext, TaskData, load_model, write_output_file
from vlbert.utils import evaluation, sorted_by_index


@dataclass
class VQADataConfig(RegionTaskDataConfig):
    """VQA data (YAML section ``data``): :class:`RegionTaskDataConfig` (dataset "easy-vqa" or "vqa-v2") and, for
    vqa-v2, the official train/eval question and annotation files (``image_id_format`` maps the numeric COCO id to
    the shards' id). min_answer_count: answers given fewer times in training are left out of the vocabulary (VQA
    v2: 9). max_train_questions / max_eval_questions: only the first N (0 = all). max_text_length: of a question.
    """

    train_questions: str = ""
    train_annotations: str = ""
    eval_questions: str = ""
    eval_annotations: str = ""
    min_answer_count: int = 1
    max_text_length: int = 32
    max_train_questions: int = 0
    max_eval_questions: int = 0


def _easy_vqa(data: VQADataConfig, seed: int):
    return easy_vqa_examples("train"), easy_vqa_examples("test"), easy_vqa_answers(), False


def _vqa_v2(data: VQADataConfig, seed: int):
    train = load_vqa_v2(data.train_questions, data.train_annotations or None, data.image_id_format)
    held_out = load_vqa_v2(data.eval_questions, data.eval_annotations or None, data.image_id_format)
    return train, held_out, build_answer_vocab(train, data.min_answer_count), True


#: dataset name -> (train, eval, answer vocabulary, drop questions without a known answer).
DATASETS = {"easy-vqa": DatasetBuilder(_easy_vqa),
            "vqa-v2": DatasetBuilder(_vqa_v2, needs=("train_questions", "eval_questions", "shards"))}


class VQAData(TaskData):
    """Training and evaluation questions with regions, and the answer vocabulary.

    Raises:
        ValueError: an unknown dataset, or vqa-v2 without its files; errors of :class:`VQADataset`.
    """

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        data, tokenizer = ctx.data, ctx.tokenizer
        train, held_out, vocab, drop_unknown = load_examples(DATASETS, data, self.seed)
        if data.max_train_questions:
            train = train[: data.max_train_questions]
        if data.max_eval_questions:
            held_out = held_out[: data.max_eval_questions]
        regions = task_regions(ctx)
        self.regions = regions
        self.answer_vocab = vocab
        self.train = VQADataset(train, regions, tokenizer, vocab, data.max_text_length, data.max_regions,
                                drop_unknown)
        self.eval = VQADataset(held_out, regions, tokenizer, vocab, data.max_text_length, data.max_regions,
                               drop_unknown=True)
        self.collator = VQACollator(tokenizer, len(vocab))
        self.feature_dim = next(iter(regions.values())).feature_dim

    @evaluation
    def predict(self, model) -> list[dict]:
        """The top answer for every evaluation question, with its VQA accuracy when answers are known."""
        device = next(model.parameters()).device
        rows = []
        for batch in self.rank_eval_batches():
            index = batch.pop("index")
            batch.pop("answer_targets")
            logits = model(**{k: v.to(device) for k, v in batch.items()}).logits
            for i, a in zip(index.tolist(), logits.argmax(-1).tolist()):
                ex = self.eval.examples[i]
                row = {"question_id": ex.question_id, "question": ex.question, "answer": self.answer_vocab[a]}
                if ex.answers:
                    row["accuracy"] = vqa_accuracy(row["answer"], ex.answers)
                rows.append((i, row))
        return [row for _, row in sorted_by_index(rows)]


def build_model(ctx: RunContext, data: VQAData) -> VLBertForVQA:
    return load_model(VLBertForVQA, ctx, num_labels=len(data.answer_vocab), region_feature_dim=data.feature_dim)


def evaluate(ctx: RunContext, data: VQAData, model) -> dict:
    """``vqa_accuracy`` over the scored evaluation questions; every answer to ``predictions.jsonl``."""
    rows = data.predict(model)
    write_output_file(ctx, "predictions.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    scored = [r["accuracy"] for r in rows if "accuracy" in r]
    return {"vqa_accuracy": sum(scored) / len(scored) if scored else float("nan"), "eval_questions": len(rows)}


def majority_baseline(ctx: RunContext, data: VQAData, model) -> dict:
    """VQA accuracy of always giving the most frequent training answer (the usual prior baseline)."""
    counts = Counter(a for ex in data.train.examples for a in reference_forms(ex.answers))
    answer = counts.most_common(1)[0][0]
    scored = [vqa_accuracy(answer, ex.answers) for ex in data.eval.examples if ex.answers]
    return {"vqa_accuracy_majority_baseline": sum(scored) / len(scored)} if scored else {}


def inference_info(ctx: RunContext, data: VQAData) -> dict:
    """The answer vocabulary (the model's output order), the maximum lengths and the regions' detector."""
    return region_task_info(ctx, data, labels=list(data.answer_vocab))


RECIPE = Recipe("vqa", VQADataConfig, VQAData, build_model, evaluate=evaluate, baselines=majority_baseline,
                uses_regions=True, inference_info=inference_info)

__all__ = ["RECIPE", "VQADataConfig", "VQAData"]
