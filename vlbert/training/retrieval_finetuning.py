"""Image-text retrieval fine-tuning (``tools/finetune_retrieval.py``): contrastive + ITM with hard negatives on
:class:`~vlbert.models.vl.VLBertForImageTextRetrieval`, Recall@1/5/10 both ways with a shortlist re-ranked by the
cross-encoder (see :func:`vlbert.data.retrieval.evaluate_retrieval`).

Datasets: ``easy-vqa`` (embedded; one templated caption per image, many images share a caption's content, so
strict Recall@K is bounded: see the ``_group`` figures) and ``karpathy`` (COCO / Flickr30K caption JSON plus your
region shards).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detectors.shards import load_regions
from vlbert.data.loading import train_loader
from vlbert.data.retrieval import (RetrievalCollator, RetrievalPairs, easy_vqa_captioned, evaluate_retrieval,
                                   load_karpathy_split)
from vlbert.models.vl import VLBertForImageTextRetrieval
from vlbert.tokenization import check_tokenizer_matches
from vlbert.training.run_config import dataclass_from_section, prepare_finetuning
from vlbert.training.trainer import Trainer, set_seed
from vlbert.training.vl_pretraining import DetectorConfig, easy_vqa_shards

logger = logging.getLogger(__name__)

TOP_LEVEL_KEYS = ("task", "init_from", "tokenizer", "model", "data", "detector", "training")


@dataclass
class RetrievalDataConfig:
    """Retrieval data (YAML section ``data``). dataset: "easy-vqa" or "karpathy" (with ``captions_file``,
    ``shards``, ``image_id_format``). shortlist: candidates per query re-ranked by the cross-encoder."""

    dataset: str = "easy-vqa"
    cache_dir: str = "~/.cache/vlbert/regions"
    shards: str = ""
    captions_file: str = ""
    image_id_format: str = "{filename}"
    eval_split: str = "test"
    max_train_images: int = 0
    max_eval_images: int = 500
    max_regions: int = 16
    shortlist: int = 16


def run_retrieval_finetuning(run_config: dict[str, Any], resume: bool = False) -> dict[str, Any]:
    """Fine-tune for retrieval; metrics.json gets i2t/t2i Recall@1/5/10 on the evaluation images."""
    training, data, init_from, tokenizer = prepare_finetuning(run_config, TOP_LEVEL_KEYS, RetrievalDataConfig)
    detector = dataclass_from_section(DetectorConfig, run_config.get("detector"), "detector")
    if data.dataset == "easy-vqa":
        train_images, eval_images = easy_vqa_captioned("train"), easy_vqa_captioned(data.eval_split)
        shards = sorted(Path(data.shards).glob("*.tar")) if data.shards else easy_vqa_shards(detector, data.cache_dir)
    elif data.dataset == "karpathy":
        if not (data.captions_file and data.shards):
            raise ValueError("dataset karpathy needs data.captions_file and data.shards")
        train_images = load_karpathy_split(data.captions_file, "train", data.image_id_format)
        eval_images = load_karpathy_split(data.captions_file, data.eval_split, data.image_id_format)
        shards = sorted(Path(data.shards).glob("*.tar"))
    else:
        raise ValueError(f"data.dataset must be 'easy-vqa' or 'karpathy', got {data.dataset!r}")
    if data.max_train_images:
        train_images = train_images[: data.max_train_images]
    if data.max_eval_images:
        eval_images = eval_images[: data.max_eval_images]
    regions = load_regions(shards)
    pairs = RetrievalPairs(train_images, regions, tokenizer, max_regions=data.max_regions)
    collator = RetrievalCollator(tokenizer)
    set_seed(training.seed)
    feature_dim = next(iter(regions.values())).feature_dim
    model = VLBertForImageTextRetrieval.from_pretrained(
        init_from, **{"region_feature_dim": feature_dim, **(run_config.get("model") or {})})
    check_tokenizer_matches(tokenizer, model.config)

    def train_batches(epoch, start, rank, world_size):
        return train_loader(pairs, collator, training.batch_size, training.seed, epoch, start, rank, world_size,
                            **training.loader_options())

    logger.info("retrieval: %d training pairs, %d evaluation images", len(pairs), len(eval_images))
    trainer = Trainer(model, training, train_batches, None, run_config=run_config, tokenizer=tokenizer)
    if resume:
        trainer.resume()
    return trainer.train(final_metrics=lambda m: evaluate_retrieval(
        m, eval_images, regions, tokenizer, shortlist=data.shortlist, max_regions=data.max_regions))


__all__ = ["run_retrieval_finetuning", "RetrievalDataConfig"]
