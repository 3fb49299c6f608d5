"""VQA fine-tuning (``tools/finetune_vqa.py``): :class:`~vlbert.models.vl.VLBertForVQA` on question + regions,
soft-score binary cross-entropy, and the official VQA accuracy on the evaluation split.

Datasets: ``easy-vqa`` (embedded: regions extracted into the same cached shards as VL pretraining) and
``vqa-v2`` (the official question/annotation JSON files plus region shards you extracted or imported).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from detectors.shards import load_regions
from vlbert.utils import evaluation
from vlbert.data.easy_vqa import answers as easy_vqa_answers
from vlbert.data.loading import eval_loader, train_loader
from vlbert.data.vqa import (VQACollator, VQADataset, build_answer_vocab, easy_vqa_examples, load_vqa_v2)
from vlbert.evaluation.vqa import normalize_answer, vqa_accuracy
from vlbert.models.vl import VLBertForVQA
from vlbert.tokenization import check_tokenizer_matches
from vlbert.training.run_config import dataclass_from_section, prepare_finetuning
from vlbert.training.trainer import Trainer, set_seed
from vlbert.training.vl_pretraining import DetectorConfig, easy_vqa_shards

logger = logging.getLogger(__name__)

TOP_LEVEL_KEYS = ("task", "init_from", "tokenizer", "model", "data", "detector", "training")


@dataclass
class VQADataConfig:
    """VQA data (YAML section ``data``).

    dataset: "easy-vqa" or "vqa-v2". For vqa-v2: train/eval question and annotation files, ``shards`` (a
    directory of region shards) and ``image_id_format`` (numeric COCO id -> shard image id). min_answer_count:
    answers given fewer times in training are left out of the vocabulary (VQA v2: 9). max_train_questions: use
    only the first N training questions (0 = all).
    """

    dataset: str = "easy-vqa"
    cache_dir: str = "~/.cache/vlbert/regions"
    shards: str = ""
    train_questions: str = ""
    train_annotations: str = ""
    eval_questions: str = ""
    eval_annotations: str = ""
    image_id_format: str = "{image_id}"
    min_answer_count: int = 1
    max_question_length: int = 32
    max_regions: int = 16
    max_train_questions: int = 0
    max_eval_questions: int = 0


class VQAData:
    """Training and evaluation questions with regions, and the answer vocabulary."""

    def __init__(self, data: VQADataConfig, detector: DetectorConfig, tokenizer, batch_size: int, seed: int = 0,
                 loader_options: dict | None = None):
        if data.dataset == "easy-vqa":
            train, evaluation = easy_vqa_examples("train"), easy_vqa_examples("test")
            vocab = [normalize_answer(a) for a in easy_vqa_answers()]
            shards = sorted(Path(data.shards).glob("*.tar")) if data.shards else easy_vqa_shards(detector, data.cache_dir)
            drop_unknown = False
        elif data.dataset == "vqa-v2":
            if not (data.train_questions and data.eval_questions and data.shards):
                raise ValueError("dataset vqa-v2 needs data.train_questions, data.train_annotations, "
                                 "data.eval_questions (+ eval_annotations to score) and data.shards")
            train = load_vqa_v2(data.train_questions, data.train_annotations or None, data.image_id_format)
            evaluation = load_vqa_v2(data.eval_questions, data.eval_annotations or None, data.image_id_format)
            vocab = build_answer_vocab(train, data.min_answer_count)
            shards = sorted(Path(data.shards).glob("*.tar"))
            drop_unknown = True
        else:
            raise ValueError(f"data.dataset must be 'easy-vqa' or 'vqa-v2', got {data.dataset!r}")
        if data.max_train_questions:
            train = train[: data.max_train_questions]
        if data.max_eval_questions:
            evaluation = evaluation[: data.max_eval_questions]
        if not shards:
            raise FileNotFoundError(f"no region shards (*.tar) in {data.shards}")
        regions = load_regions(shards)
        self.answer_vocab = vocab
        self.train = VQADataset(train, regions, tokenizer, vocab, data.max_question_length, data.max_regions,
                                drop_unknown)
        self.eval = VQADataset(evaluation, regions, tokenizer, vocab, data.max_question_length, data.max_regions,
                               drop_unknown=True)
        self.collator = VQACollator(tokenizer, len(vocab))
        self.batch_size, self.seed = batch_size, seed
        self.loader_options = loader_options or {}
        any_regions = next(iter(regions.values()))
        self.feature_dim = any_regions.feature_dim

    def train_batches(self, epoch: int, start: int, rank: int, world_size: int):
        return train_loader(self.train, self.collator, self.batch_size, self.seed, epoch, start, rank, world_size,
                            **self.loader_options)

    def eval_batches(self):
        return eval_loader(self.eval, self.collator, 2 * self.batch_size)

    @evaluation
    def predict(self, model) -> list[dict]:
        """The top answer for every evaluation question, with its VQA accuracy when answers are known."""
        device = next(model.parameters()).device
        rows = []
        for batch in self.eval_batches():
            index = batch.pop("index")
            batch.pop("answer_targets")
            logits = model(**{k: v.to(device) for k, v in batch.items()}).logits
            for i, a in zip(index.tolist(), logits.argmax(-1).tolist()):
                ex = self.eval.examples[i]
                row = {"question_id": ex.question_id, "question": ex.question, "answer": self.answer_vocab[a]}
                if ex.answers:
                    row["accuracy"] = vqa_accuracy(row["answer"], ex.answers)
                rows.append(row)
        return rows


def run_vqa_finetuning(run_config: dict[str, Any], resume: bool = False) -> dict[str, Any]:
    """Fine-tune for VQA; metrics.json gets ``vqa_accuracy`` on the evaluation split and predictions.jsonl the
    answers."""
    training, data_config, init_from, tokenizer = prepare_finetuning(run_config, TOP_LEVEL_KEYS, VQADataConfig)
    detector = dataclass_from_section(DetectorConfig, run_config.get("detector"), "detector")
    data = VQAData(data_config, detector, tokenizer, training.batch_size, training.seed, training.loader_options())
    set_seed(training.seed)
    overrides = {"num_labels": len(data.answer_vocab), "region_feature_dim": data.feature_dim,
                 **(run_config.get("model") or {})}
    model = VLBertForVQA.from_pretrained(init_from, **overrides)
    check_tokenizer_matches(tokenizer, model.config)
    logger.info("VQA: %d training questions, %d evaluation questions, %d answers", len(data.train), len(data.eval),
                len(data.answer_vocab))
    trainer = Trainer(model, training, data.train_batches, data.eval_batches, run_config=run_config,
                      tokenizer=tokenizer)
    if resume:
        trainer.resume()

    def final(model) -> dict[str, Any]:
        rows = data.predict(model)
        out = Path(training.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        scored = [r["accuracy"] for r in rows if "accuracy" in r]
        return {"vqa_accuracy": sum(scored) / len(scored) if scored else float("nan"),
                "eval_questions": len(rows)}

    return trainer.train(final_metrics=final)


__all__ = ["run_vqa_finetuning", "VQADataConfig", "VQAData"]
