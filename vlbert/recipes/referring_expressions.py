"""Referring expression comprehension (``vlbert finetune --task refcoco``): pick the region an expression
names; accuracy = the chosen region's box has IoU >= 0.5 with the referred object's box (UNITER section 4),
reported with ground-truth boxes as regions (``data.boxes: gt``) or with the detector's (``detector``).

Datasets: ``easy-vqa`` (the embedded demonstration: composites of 2-4 easy-VQA images, "the blue triangle"; see
:func:`vlbert.data.refcoco.easy_vqa_composites`) and ``refcoco`` (refs file + instances.json + region shards).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from vlbert.data.refcoco import ReferringDataset, box_iou, easy_vqa_composites, load_refcoco
from vlbert.detectors.cache import cached_shards
from vlbert.detectors.store import RegionStore, region_count
from vlbert.models.referring import VLBertForReferringExpressions
from vlbert.processing import RegionSource
from vlbert.recipes.init_from import load_model
from vlbert.recipes.regions import (
    DatasetBuilder,
    Positive,
    RegionTaskData,
    RegionTaskDataConfig,
    TextLength,
    evaluate,
    task_regions,
)
from vlbert.recipes.runner import Recipe, RunContext


@dataclass
class ReferringDataConfig(RegionTaskDataConfig):
    """Referring-expression data (YAML section ``data``): :class:`RegionTaskDataConfig` (dataset "easy-vqa" or
    "refcoco": ``refs_file``, ``instances_file``, ``train_split`` / ``eval_split``, ``shards`` with the regions to
    choose from). boxes: for easy-VQA, "gt" (the tiles' boxes are the regions) or "detector" (the detector's
    proposals). train_images / eval_images: easy-VQA composites drawn."""

    boxes: Literal["gt", "detector"] = "gt"
    refs_file: str = ""
    instances_file: str = ""
    train_split: str = "train"
    eval_split: str = "val"
    train_images: Positive = 1500
    eval_images: Positive = 300
    max_text_length: TextLength = 16


def _easy_vqa(data: ReferringDataConfig, seed: int):
    folder = Path(data.cache_dir).expanduser() / "refcoco-composite-images"
    train, train_files, train_tiles = easy_vqa_composites("train", data.train_images, folder, seed)
    held_out, eval_files, eval_tiles = easy_vqa_composites("test", data.eval_images, folder, seed)
    return train, held_out, ({**train_files, **eval_files}, {**train_tiles, **eval_tiles})


def _refcoco(data: ReferringDataConfig, seed: int):
    return (
        load_refcoco(data.refs_file, data.instances_file, data.train_split, data.image_id_format),
        load_refcoco(data.refs_file, data.instances_file, data.eval_split, data.image_id_format),
        None,
    )


#: dataset name -> (train, eval expressions, the composites' (image files, tile boxes) or None: regions in shards).
DATASETS = {
    "easy-vqa": DatasetBuilder(_easy_vqa),
    "refcoco": DatasetBuilder(_refcoco, needs=("refs_file", "instances_file", "shards")),
}


def _easy_vqa_regions(ctx: RunContext, files: dict, tiles: dict):
    """Regions of the composites: the tiles' own boxes (gt) or the detector's proposals, extracted once."""
    if ctx.data.boxes not in ("gt", "detector"):
        raise ValueError(f"data.boxes must be 'gt' or 'detector', got {ctx.data.boxes!r}")
    given = tiles if ctx.data.boxes == "gt" else None
    return RegionStore(
        cached_shards(ctx.detector, files, ctx.data.cache_dir, "refcoco-composites", boxes=given)[0].parent
    )


class ReferringData(RegionTaskData):
    """Training and evaluation expressions with the regions to choose from
    (:class:`~vlbert.recipes.regions.RegionTaskData`); the easy-VQA composites bring their own images.

    Raises:
        ValueError: an unknown dataset or box setting, refcoco without its files.
    """

    datasets, dataset_class, target_keys = DATASETS, ReferringDataset, ("target_region", "target_box")

    def load_regions(self, ctx: RunContext):
        composites = self.extra[0]
        return task_regions(ctx) if composites is None else _easy_vqa_regions(ctx, *composites)

    def region_source(self, ctx: RunContext) -> RegionSource:
        """The composites' regions are always extracted with the run's detector, whatever data.shards says."""
        if self.extra[0] is None:
            return super().region_source(ctx)
        return RegionSource.from_store(self.regions, ctx.detector)

    @staticmethod
    def hit(example, box: np.ndarray) -> bool:
        """Whether ``box`` (float [4], pixels xyxy: a region of the example's image) has IoU >= 0.5 with the
        referred box."""
        return bool(box_iou(np.array([example.box]), box[None])[0, 0] >= 0.5)

    def predict(self, model) -> tuple[list[dict], dict[str, float]]:
        """(one row per evaluation expression: ``ref_id``, ``image_id``, ``expression``, the chosen ``region`` and
        its ``box`` in pixels (x1, y1, x2, y2), ``hit`` (IoU >= 0.5 with the referred box); the accuracy and its
        upper bound: the share of expressions whose image has any region with IoU >= 0.5)."""
        rows = []
        for i, choice in zip(*self.predict_labels(model)[::2], strict=True):
            ex = self.eval.examples[i]
            box = self.regions[ex.image_id].boxes[choice]  # one read of the image's regions per expression
            rows.append(
                {
                    "ref_id": ex.ref_id,
                    "image_id": ex.image_id,
                    "expression": ex.expression,
                    "region": choice,
                    "box": [float(v) for v in box],
                    "hit": self.hit(ex, box),
                }
            )
        reachable = 0
        for example in self.eval.examples:
            n = self.processor.kept_regions(region_count(self.regions, example.image_id))
            reachable += bool((box_iou(np.array([example.box]), self.regions[example.image_id].boxes[:n]) >= 0.5).any())
        return rows, {
            "accuracy": sum(r["hit"] for r in rows) / len(self.eval),
            "accuracy_upper_bound": reachable / len(self.eval),
        }


def build_model(ctx: RunContext, data: ReferringData) -> VLBertForReferringExpressions:
    return load_model(VLBertForReferringExpressions, ctx, region_feature_dim=data.feature_dim)


def baselines(ctx: RunContext, data: ReferringData, model) -> dict:
    """Accuracy of always choosing the region at the most frequent training target position."""
    position = Counter(data.train[i]["target_region"] for i in range(len(data.train))).most_common(1)[0][0]
    hits = sum(
        data.hit(ex, data.regions[ex.image_id].boxes[min(position, region_count(data.regions, ex.image_id) - 1)])
        for ex in data.eval.examples
    )
    return {"accuracy_majority_position_baseline": hits / len(data.eval)}


def processor_fields(ctx: RunContext, data: ReferringData) -> dict:
    """Whether the regions' boxes were given (the easy-VQA tiles, ``boxes: gt``: inference then needs the candidate
    boxes too) or detected."""
    given = ctx.data.dataset == "easy-vqa" and ctx.data.boxes == "gt"
    return {"boxes": "given" if given else "detector"}


RECIPE = Recipe(
    "refcoco",
    ReferringDataConfig,
    ReferringData,
    build_model,
    evaluate=evaluate,
    baselines=baselines,
    uses_regions=True,
    processor_fields=processor_fields,
)

__all__ = ["RECIPE", "ReferringDataConfig", "ReferringData"]
