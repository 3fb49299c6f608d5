"""Image-text retrieval fine-tuning (``vlbert finetune --task retrieval``): contrastive + ITM with hard negatives on
:class:`~vlbert.models.retrieval.VLBertForImageTextRetrieval`, Recall@1/5/10 both ways and their mean (UNITER's
``r_mean``) with a shortlist re-ranked by the cross-encoder (see
:func:`vlbert.evaluation.retrieval.evaluate_retrieval`).

Datasets: ``easy-vqa`` (embedded; one templated caption per image, many images share a caption's content, so
strict Recall@K is bounded: see the ``_group`` figures) and ``karpathy`` (COCO / Flickr30K caption JSON plus your
region shards).
"""

from __future__ import annotations

from dataclasses import dataclass

from vlbert.data.captions import load_karpathy_split
from vlbert.data.retrieval import RetrievalPairs, check_evaluation_images, easy_vqa_captioned
from vlbert.evaluation.retrieval import evaluate_retrieval
from vlbert.models.retrieval import VLBertForImageTextRetrieval
from vlbert.processing.collator import RetrievalCollator
from vlbert.recipes.init_from import load_model
from vlbert.recipes.regions import (
    Count,
    DatasetBuilder,
    Positive,
    RegionTaskDataConfig,
    TextLength,
    attach_images,
    load_examples,
    task_region_source,
    task_regions,
)
from vlbert.recipes.run_processor import build_run_processor
from vlbert.recipes.runner import Recipe, RunContext, TaskData


@dataclass
class RetrievalDataConfig(RegionTaskDataConfig):
    """Retrieval data (YAML section ``data``): :class:`RegionTaskDataConfig` (dataset "easy-vqa" or "karpathy",
    the Karpathy split's ``captions_file``, image ids from its ``{filename}`` by default). eval_split: the split
    evaluated; max_train_images / max_eval_images: only the first N (0 = all). shortlist: candidates per query
    re-ranked by the cross-encoder. max_text_length: of a caption."""

    captions_file: str = ""
    eval_split: str = "test"
    max_train_images: Count = 0
    max_eval_images: Count = 500
    max_text_length: TextLength = 32
    shortlist: Positive = 16


#: dataset name -> (training images, evaluation images), each with its captions.
def _karpathy(data: RetrievalDataConfig, seed: int):
    return (
        load_karpathy_split(data.captions_file, "train", data.image_id_format),
        load_karpathy_split(data.captions_file, data.eval_split, data.image_id_format),
    )


DATASETS = {
    "easy-vqa": DatasetBuilder(lambda data, seed: (easy_vqa_captioned("train"), easy_vqa_captioned(data.eval_split))),
    "karpathy": DatasetBuilder(_karpathy, needs=("captions_file", "shards"), image_id_format="{filename}"),
}


class RetrievalData(TaskData):
    """Training pairs and evaluation images (evaluated by Recall@K at the end, not by held-out batches). For a model
    with a ``visual_backbone``, ``images`` is the :class:`~vlbert.processing.images.ImageReader` of the training and
    evaluation images (:func:`attach_images`: the pairs carry their pixels, the evaluation reads them) and
    ``feature_dim`` the backbone's; else ``images`` is None. ``processor``: the run's
    (:func:`~vlbert.recipes.run_processor.build_run_processor`), whose tokenizer and limits the pairs and the
    evaluation take.

    Raises:
        ValueError: an unknown dataset, karpathy without ``captions_file``; from :func:`attach_images` (images
            without files, no ``data.image_dir``).
    """

    def __init__(self, ctx: RunContext):
        super().__init__(ctx)
        data = ctx.data
        train_images, eval_images = load_examples(DATASETS, data, self.seed)
        self.train_images = train_images[: data.max_train_images] if data.max_train_images else train_images
        self.eval_images = eval_images[: data.max_eval_images] if data.max_eval_images else eval_images
        self.regions = task_regions(ctx)
        source = data.captions_file or f"the {data.dataset} dataset"
        check_evaluation_images(self.eval_images, self.regions, source, data.eval_split)
        self.processor = processor = build_run_processor(ctx, self, task_region_source(ctx, self.regions))
        self.train = RetrievalPairs(self.train_images, self.regions, processor)
        self.collator = RetrievalCollator(processor.tokenizer)
        eval_ids = [im.image_id for im in self.eval_images]
        self.images = attach_images(
            ctx, (self.train,), lambda d: [im.image_id for im, _, _ in d.pairs] + eval_ids, processor
        )
        self.feature_dim = processor.region_source.feature_dim


def build_model(ctx: RunContext, data: RetrievalData) -> VLBertForImageTextRetrieval:
    return load_model(VLBertForImageTextRetrieval, ctx, region_feature_dim=data.feature_dim)


def evaluate(ctx: RunContext, data: RetrievalData, model) -> dict:
    return evaluate_retrieval(
        model,
        data.eval_images,
        data.regions,
        data.processor,
        shortlist=ctx.data.shortlist,
        image_reader=data.images,
    )


def processor_fields(ctx: RunContext, data: RetrievalData) -> dict:
    """The shortlist (candidates per query the cross-encoder re-ranks)."""
    return {"shortlist": ctx.data.shortlist}


RECIPE = Recipe(
    "retrieval",
    RetrievalDataConfig,
    RetrievalData,
    build_model,
    evaluate=evaluate,
    uses_regions=True,
    processor_fields=processor_fields,
)

__all__ = ["RECIPE", "RetrievalDataConfig", "RetrievalData"]
