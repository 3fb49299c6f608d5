"""Visual entailment (``vlbert finetune --task snli-ve``): image + hypothesis -> entailment / neutral /
contradiction from the joint [CLS] (SNLI-VE; UNITER section 4), accuracy on the evaluation split.

Datasets: ``easy-vqa`` (the embedded demonstration, see :func:`vlbert.data.visual_entailment.easy_vqa_entailment`)
and ``snli-ve`` (the public JSONL files plus region shards of the Flickr30K images).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from vlbert.data.visual_entailment import LABELS, EntailmentDataset, easy_vqa_entailment, load_snli_ve
from vlbert.models.vl_classification import VLBertForSequenceClassification
from vlbert.recipes.init_from import load_model
from vlbert.recipes.regions import (
    DatasetBuilder,
    RegionTaskData,
    RegionTaskDataConfig,
    evaluate,
    majority_baseline,
)
from vlbert.recipes.runner import Recipe, RunContext


@dataclass
class EntailmentDataConfig(RegionTaskDataConfig):
    """Visual entailment data (YAML section ``data``): :class:`RegionTaskDataConfig` (dataset "easy-vqa" or
    "snli-ve", the public ``train_file`` / ``eval_file`` JSONL)."""

    train_file: str = ""
    eval_file: str = ""


#: dataset name -> (train, eval) pairs.
DATASETS = {
    "easy-vqa": DatasetBuilder(
        lambda data, seed: (easy_vqa_entailment("train", seed), easy_vqa_entailment("test", seed))
    ),
    "snli-ve": DatasetBuilder(
        lambda data, seed: (
            load_snli_ve(data.train_file, data.image_id_format),
            load_snli_ve(data.eval_file, data.image_id_format),
        ),
        needs=("train_file", "eval_file", "shards"),
    ),
}


class EntailmentData(RegionTaskData):
    """Training and evaluation pairs with regions (:class:`~vlbert.recipes.regions.RegionTaskData`).

    Raises:
        ValueError: an unknown dataset, or snli-ve without its files.
    """

    datasets, dataset_class = DATASETS, EntailmentDataset

    def predict(self, model) -> tuple[list[dict], dict[str, float]]:
        """(one row per evaluation pair: ``pairID``, ``image_id``, ``hypothesis``, ``prediction``, ``gold_label``;
        accuracy overall and per gold label). SNLI-VE defines no results format: ``predictions.jsonl`` holds the
        rows."""
        index, gold, predicted = self.predict_labels(model)
        rows = [
            {
                "pairID": self.eval.examples[i].pair_id,
                "image_id": self.eval.examples[i].image_id,
                "hypothesis": self.eval.examples[i].hypothesis,
                "prediction": LABELS[p],
                "gold_label": LABELS[g],
            }
            for i, g, p in zip(index, gold, predicted, strict=True)
        ]
        hits, totals = Counter(g for g, p in zip(gold, predicted, strict=True) if g == p), Counter(gold)
        out = {"accuracy": sum(hits.values()) / max(len(gold), 1)}
        out.update({f"accuracy_{LABELS[k]}": hits[k] / totals[k] for k in sorted(totals)})
        return rows, out


def build_model(ctx: RunContext, data: EntailmentData) -> VLBertForSequenceClassification:
    return load_model(VLBertForSequenceClassification, ctx, num_labels=len(LABELS), region_feature_dim=data.feature_dim)


def processor_fields(ctx: RunContext, data: EntailmentData) -> dict:
    """The processor's label names."""
    return {"labels": list(LABELS)}


RECIPE = Recipe(
    "snli-ve",
    EntailmentDataConfig,
    EntailmentData,
    build_model,
    evaluate=evaluate,
    baselines=majority_baseline,
    uses_regions=True,
    processor_fields=processor_fields,
)

__all__ = ["RECIPE", "EntailmentDataConfig", "EntailmentData"]
