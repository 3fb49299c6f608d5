"""Visual entailment (``tools/finetune.py --task snli-ve``): image + hypothesis -> entailment / neutral /
contradiction from the joint [CLS] (SNLI-VE; UNITER section 4), accuracy on the evaluation split.

Datasets: ``easy-vqa`` (the embedded demonstration, see :func:`vlbert.data.visual_entailment.easy_vqa_entailment`)
and ``snli-ve`` (the public JSONL files plus region shards of the Flickr30K images).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from vlbert.data.visual_entailment import (LABELS, EntailmentCollator, EntailmentDataset, easy_vqa_entailment,
                                           load_snli_ve)
from vlbert.evaluation.classification import predict_labels
from vlbert.models.vl_classification import VLBertForSequenceClassification
from vlbert.recipes.regions import task_regions
from vlbert.recipes.runner import Recipe, RunContext, TaskData, load_model


@dataclass
class EntailmentDataConfig:
    """Visual entailment data (YAML section ``data``). dataset: "easy-vqa" or "snli-ve" (with ``train_file``,
    ``eval_file``, ``shards`` and ``image_id_format``)."""

    dataset: str = "easy-vqa"
    cache_dir: str = "~/.cache/vlbert/regions"
    shards: str = ""
    train_file: str = ""
    eval_file: str = ""
    image_id_format: str = "{image_id}"
    max_text_length: int = 40
    max_regions: int = 16
    max_train_examples: int = 0


class EntailmentData(TaskData):
    """Training and evaluation pairs with regions.

    Raises:
        ValueError: an unknown dataset, or snli-ve without its files.
    """

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        data = ctx.data
        if data.dataset == "easy-vqa":
            train, held_out = easy_vqa_entailment("train", self.seed), easy_vqa_entailment("test", self.seed)
        elif data.dataset == "snli-ve":
            if not (data.train_file and data.eval_file):
                raise ValueError("dataset snli-ve needs data.train_file, data.eval_file and data.shards")
            train = load_snli_ve(data.train_file, data.image_id_format)
            held_out = load_snli_ve(data.eval_file, data.image_id_format)
        else:
            raise ValueError(f"data.dataset must be 'easy-vqa' or 'snli-ve', got {data.dataset!r}")
        if data.max_train_examples:
            train = train[: data.max_train_examples]
        regions = task_regions(ctx)
        self.train = EntailmentDataset(train, regions, ctx.tokenizer, data.max_text_length, data.max_regions)
        self.eval = EntailmentDataset(held_out, regions, ctx.tokenizer, data.max_text_length, data.max_regions)
        self.collator = EntailmentCollator(ctx.tokenizer)
        self.feature_dim = next(iter(regions.values())).feature_dim

    def accuracy(self, model) -> dict[str, float]:
        """Accuracy on the evaluation pairs, overall and per gold label."""
        gold, predicted = predict_labels(model, self.eval_batches())
        hits, totals = Counter(g for g, p in zip(gold, predicted) if g == p), Counter(gold)
        out = {"accuracy": sum(hits.values()) / max(len(gold), 1)}
        out.update({f"accuracy_{LABELS[k]}": hits[k] / totals[k] for k in sorted(totals)})
        return out


def build_model(ctx: RunContext, data: EntailmentData) -> VLBertForSequenceClassification:
    return load_model(VLBertForSequenceClassification, ctx, num_labels=len(LABELS), region_feature_dim=data.feature_dim)


def majority_baseline(ctx: RunContext, data: EntailmentData, model) -> dict:
    """Evaluation accuracy of always answering the most frequent training label."""
    majority = Counter(ex.label for ex in data.train.examples).most_common(1)[0][0]
    return {"accuracy_majority_baseline": sum(ex.label == majority for ex in data.eval.examples) / len(data.eval)}


RECIPE = Recipe("snli-ve", EntailmentDataConfig, EntailmentData, build_model,
                evaluate=lambda ctx, data, model: data.accuracy(model), baselines=majority_baseline, uses_regions=True)

__all__ = ["RECIPE", "EntailmentDataConfig", "EntailmentData"]
