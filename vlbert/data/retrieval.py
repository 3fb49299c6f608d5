"""Image-text retrieval data: captioned images from easy-VQA or the Karpathy-split caption JSON (COCO,
Flickr30K) and batches of aligned pairs (the evaluation is :func:`vlbert.evaluation.retrieval.evaluate_retrieval`)."""

from __future__ import annotations

from typing import Sequence

import torch

from vlbert.data.captions import CaptionedImage

# recipes/retrieval.py imports it from here
from vlbert.data.easy_vqa import CAPTION_TEMPLATES, color_and_shape
from vlbert.detectors.regions import Regions
from vlbert.processing import VLProcessor


def easy_vqa_captioned(split: str, seed: int = 0) -> list[CaptionedImage]:
    """easy-VQA images of ``split`` with one templated caption each, grouped by (colour, shape)."""
    import random

    rng = random.Random(f"retrieval-{seed}-{split}")
    return [
        CaptionedImage(i, (rng.choice(CAPTION_TEMPLATES).format(color=c, shape=s),), f"{c} {s}")
        for i, (c, s) in color_and_shape(split).items()
    ]


def check_evaluation_images(images: Sequence[CaptionedImage], regions, source: str, split: str) -> None:
    """Refuse evaluation images Recall@K cannot score as the benchmark does, before any training: an image listed
    twice in the split (it would be two candidates, one of them always "wrong"), or one without regions.

    Args:
        images: the split's images in file order; regions: image id -> regions (anything with ``in``).
        source: the caption file (or dataset) the images come from, for messages; split: its split's name.
    Raises:
        ValueError: the image named with its places in the split (or how many lack regions) and the fix.
    """
    first: dict[str, int] = {}
    for k, image in enumerate(images):
        if image.image_id in first:
            raise ValueError(
                f"{source}: image {image.image_id!r} is listed twice in split {split!r} (images {first[image.image_id]}"
                f" and {k} of the split); Recall@K ranks each image once: list it once, its captions together"
            )
        first[image.image_id] = k
    missing = [(k, im.image_id) for k, im in enumerate(images) if im.image_id not in regions]
    if missing:
        k, image_id = missing[0]
        raise ValueError(
            f"{source}: image {image_id!r} (image {k} of split {split!r}) has no regions in data.shards "
            f"({len(missing)} of the split's {len(images)} images have none); extract their regions first "
            "(vlbert extract), or set data.max_eval_images to leave them out"
        )


class RetrievalPairs(torch.utils.data.Dataset):
    """One item per (image, caption) pair: caption ids, the image's regions (both by the run's ``processor``, a
    :class:`~vlbert.processing.VLProcessor`) and its group id; with an
    :attr:`image_reader` (a model with a visual backbone: :func:`vlbert.recipes.regions.attach_images` sets it), also
    the image's ``pixels`` (:func:`~vlbert.processing.regions.with_pixels`).

    Raises:
        ValueError: an image has no regions.
    """

    def __init__(self, images: Sequence[CaptionedImage], regions: dict[str, Regions], processor: VLProcessor):
        missing = [im.image_id for im in images if im.image_id not in regions]
        if missing:
            raise ValueError(f"{len(missing)} images have no regions (e.g. {missing[:3]}); extract them first")
        groups = {g: k for k, g in enumerate(sorted({im.group or im.image_id for im in images}))}
        self.pairs = [(im, c, groups[im.group or im.image_id]) for im in images for c in im.captions]
        self.input_ids = processor.text_ids([c for _, c, _ in self.pairs])
        self.regions, self.processor = regions, processor

    def __len__(self) -> int:
        return len(self.pairs)

    image_reader = None

    def lengths(self) -> list[int]:
        return [len(ids) for ids in self.input_ids]

    def __getitem__(self, index: int) -> dict:
        image, _, group = self.pairs[index]
        regions = self.processor.region_item(self.regions[image.image_id], image.image_id, self.image_reader)
        return {"input_ids": self.input_ids[index], **regions, "group": group}


__all__ = ["easy_vqa_captioned", "check_evaluation_images", "RetrievalPairs"]
