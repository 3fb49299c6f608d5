"""Visual entailment (``tools/finetune.py --task snli-ve``): image + hypothesis -> entailment / neutral /
contradiction from the joint [CLS] (SNLI-VE; UNITER section 4), accuracy on the evaluation split.

Datasets: ``easy-vqa`` (the embedded demonstration, see :func:`vlbert.data.visual_entailment.easy_vqa_entailment`)
and ``snli-ve`` (the public JSONL files plus region shards of the Flickr30K images).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

from vlbert.data.visual_entailment import (LABELS, EntailmentCollator, EntailmentDataset, easy_vqa_entailment,
                                           load_snli_ve)
from vlbert.evaluation.classification import predict_labels
from vlbert.models.vl_classification import VLBertForSequenceClassification
from vlbert.recipes.regions import DatasetBuilder, RegionTaskDataConfig, load_examples, region_task_info, task_regions
from vlbert.recipes.runner import Recipe, RunContext, TaskData, load_model, write_output_file
from vlbert.utils import gathered_columns


@dataclass
class EntailmentDataConfig(RegionTaskDataConfig):
    """Visual entailment data (YAML section ``data``): :class:`RegionTaskDataConfig` (dataset "easy-vqa" or
    "snli-ve", the public ``train_file`` / ``eval_file`` JSONL). max_train_examples: only the first N (0 = all)."""

    train_file: str = ""
    eval_file: str = ""
    max_train_examples: int = 0


#: dataset name -> (train, eval) pairs.
DATASETS = {
    "easy-vqa": DatasetBuilder(lambda data, seed: (easy_vqa_entailment("train", seed),
                                                   easy_vqa_entailment("test", seed))),
    "snli-ve": DatasetBuilder(lambda data, seed: (load_snli_ve(data.train_file, data.image_id_format),
                                                  load_snli_ve(data.eval_file, data.image_id_format)),
                              needs=("train_file", "eval_file", "shards")),
}


class EntailmentData(TaskData):
    """Training and evaluation pairs with regions.

    Raises:
        ValueError: an unknown dataset, or snli-ve without its files.
    """

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        data = ctx.data
        train, held_out = load_examples(DATASETS, data, self.seed)
        if data.max_train_examples:
            train = train[: data.max_train_examples]
        regions = task_regions(ctx)
        self.regions = regions
        self.train = EntailmentDataset(train, regions, ctx.tokenizer, data.max_text_length, data.max_regions)
        self.eval = EntailmentDataset(held_out, regions, ctx.tokenizer, data.max_text_length, data.max_regions)
        self.collator = EntailmentCollator(ctx.tokenizer)
        self.feature_dim = next(iter(regions.values())).feature_dim

    def predict(self, model) -> tuple[list[dict], dict[str, float]]:
        """(one row per evaluation pair: ``pairID``, ``image_id``, ``hypothesis``, ``prediction``, ``gold_label``;
        accuracy overall and per gold label)."""
        index, gold, predicted = gathered_columns(*predict_labels(model, self.rank_eval_batches()))
        rows = [{"pairID": self.eval.examples[i].pair_id, "image_id": self.eval.examples[i].image_id,
                 "hypothesis": self.eval.examples[i].hypothesis, "prediction": LABELS[p], "gold_label": LABELS[g]}
                for i, g, p in zip(index, gold, predicted)]
        hits, totals = Counter(g for g, p in zip(gold, predicted) if g == p), Counter(gold)
        out = {"accuracy": sum(hits.values()) / max(len(gold), 1)}
        out.update({f"accuracy_{LABELS[k]}": hits[k] / totals[k] for k in sorted(totals)})
        return rows, out


def evaluate(ctx: RunContext, data: EntailmentData, model) -> dict:
    """Accuracy overall and per gold label; every prediction to ``predictions.jsonl`` (SNLI-VE defines no
    results format: one JSON object per pair with its ``pairID`` and ``prediction``)."""
    rows, metrics = data.predict(model)
    write_output_file(ctx, "predictions.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return metrics


def build_model(ctx: RunContext, data: EntailmentData) -> VLBertForSequenceClassification:
    return load_model(VLBertForSequenceClassification, ctx, num_labels=len(LABELS), region_feature_dim=data.feature_dim)


def majority_baseline(ctx: RunContext, data: EntailmentData, model) -> dict:
    """Evaluation accuracy of always answering the most frequent training label."""
    majority = Counter(ex.label for ex in data.train.examples).most_common(1)[0][0]
    return {"accuracy_majority_baseline": sum(ex.label == majority for ex in data.eval.examples) / len(data.eval)}


def inference_info(ctx: RunContext, data: EntailmentData) -> dict:
    """Label names, the maximum lengths and the regions' detector."""
    return region_task_info(ctx, data, labels=list(LABELS))


RECIPE = Recipe("snli-ve", EntailmentDataConfig, EntailmentData, build_model,
                evaluate=evaluate, baselines=majority_baseline, uses_regions=True,
                inference_info=inference_info)

__all__ = ["RECIPE", "EntailmentDataConfig", "EntailmentData"]
