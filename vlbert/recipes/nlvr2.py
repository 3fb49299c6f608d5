"""NLVR2 (``tools/finetune_nlvr2.py``): is a statement true of two images? The statement is encoded with each
image and both pooled outputs are classified together (UNITER / LXMERT); accuracy and consistency on the evaluation
split, as NLVR2's official ``metrics.py`` computes them from the ``predictions.csv`` this recipe writes
(:mod:`vlbert.evaluation.nlvr2`).

Datasets: ``easy-vqa`` (the embedded demonstration, see :func:`vlbert.data.nlvr2.easy_vqa_image_pairs`) and ``nlvr2``
(the public JSONL files plus region shards of the NLVR2 images).
"""

from __future__ import annotations

from dataclasses import dataclass

from vlbert.data.nlvr2 import ImagePairDataset, easy_vqa_image_pairs, load_nlvr2
from vlbert.evaluation.nlvr2 import nlvr2_scores
from vlbert.models.vl_classification import VLBertForImagePairClassification
from vlbert.recipes.init_from import load_model
from vlbert.recipes.regions import (
    Count,
    DatasetBuilder,
    RegionTaskData,
    RegionTaskDataConfig,
    evaluate,
    majority_baseline,
)
from vlbert.recipes.report import standard_error
from vlbert.recipes.runner import Recipe, RunContext


@dataclass
class NLVR2DataConfig(RegionTaskDataConfig):
    """NLVR2 data (YAML section ``data``): :class:`RegionTaskDataConfig` (dataset "easy-vqa", ``train_pairs`` /
    ``eval_pairs`` statements drawn, or "nlvr2", the public ``train_file`` / ``eval_file`` JSONL; image ids from
    ``{stem}`` = ``<split>-<set>-<pair>`` and ``{k}`` = 0 left / 1 right)."""

    train_file: str = ""
    eval_file: str = ""
    train_pairs: Count = 8000
    eval_pairs: Count = 2000


#: dataset name -> (train, eval) statements.
DATASETS = {
    "easy-vqa": DatasetBuilder(
        lambda data, seed: (
            easy_vqa_image_pairs("train", data.train_pairs, seed),
            easy_vqa_image_pairs("test", data.eval_pairs, seed),
        )
    ),
    "nlvr2": DatasetBuilder(
        lambda data, seed: (
            load_nlvr2(data.train_file, data.image_id_format),
            load_nlvr2(data.eval_file, data.image_id_format),
        ),
        needs=("train_file", "eval_file", "shards"),
        image_id_format="{stem}-img{k}",
    ),
}


class NLVR2Data(RegionTaskData):
    """Training and evaluation statements with the regions of both images
    (:class:`~vlbert.recipes.regions.RegionTaskData`).

    Raises:
        ValueError: an unknown dataset, or nlvr2 without its files.
    """

    datasets, dataset_class = DATASETS, ImagePairDataset

    predictions_file = "predictions.csv"

    def predict(self, model) -> tuple[list[dict], dict[str, float]]:
        """(``{"identifier", "prediction": True | False}`` of every evaluation statement; ``accuracy``,
        ``consistency`` (the share of unique sentences whose every example is right), ``eval_statements`` and
        ``eval_sentences``: :func:`~vlbert.evaluation.nlvr2.nlvr2_scores`, lil-lab/nlvr@e6a286a
        ``nlvr2/eval/metrics.py``; ``accuracy_n``, ``accuracy_stderr``: the binomial standard error over the
        statements, :func:`~vlbert.recipes.report.standard_error`)."""
        index, gold, predicted = self.predict_labels(model)
        rows = [
            {"identifier": self.eval.examples[i].identifier, "prediction": bool(p)}
            for i, p in zip(index, predicted, strict=True)
        ]
        hits = [g == p for g, p in zip(gold, predicted, strict=True)]
        scores = nlvr2_scores([r["identifier"] for r in rows], hits)
        return rows, {**scores, **standard_error("accuracy", [float(h) for h in hits]), "eval_statements": len(rows)}

    def predictions_text(self, rows: list[dict]) -> str:
        """The NLVR2 evaluation script's format: ``identifier,True|False`` per line, no header (lil-lab/nlvr@e6a286a
        ``nlvr2/eval/metrics.py`` reads it: ``python metrics.py predictions.csv dev.json``)."""
        return "".join(f"{r['identifier']},{r['prediction']}\n" for r in rows)


def build_model(ctx: RunContext, data: NLVR2Data) -> VLBertForImagePairClassification:
    return load_model(VLBertForImagePairClassification, ctx, num_labels=2, region_feature_dim=data.feature_dim)


def processor_fields(ctx: RunContext, data: NLVR2Data) -> dict:
    """The processor's label names (index 1 = the statement is true)."""
    return {"labels": ["False", "True"]}


RECIPE = Recipe(
    "nlvr2",
    NLVR2DataConfig,
    NLVR2Data,
    build_model,
    evaluate=evaluate,
    baselines=majority_baseline,
    uses_regions=True,
    processor_fields=processor_fields,
)

__all__ = ["RECIPE", "NLVR2DataConfig", "NLVR2Data"]
