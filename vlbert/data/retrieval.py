"""Image-text retrieval data: captioned images from easy-VQA or the Karpathy-split caption JSON (COCO,
Flickr30K) and batches of aligned pairs (the evaluation is :func:`vlbert.evaluation.retrieval.evaluate_retrieval`)."""

from __future__ import annotations

from typing import Sequence

import torch

from vlbert.data.captions import CaptionedImage, load_karpathy_split
from vlbert.data.easy_vqa import CAPTION_TEMPLATES, color_and_shape
from vlbert.data.padding import pad_text
from vlbert.data.regions import pad_regions, region_item, with_pixels
from vlbert.detectors.regions import Regions
from vlbert.layers.unpadded import unpadded_layout


def easy_vqa_captioned(split: str, seed: int = 0) -> list[CaptionedImage]:
    """easy-VQA images of ``split`` with one templated caption each, grouped by (colour, shape)."""
    import random

    rng = random.Random(f"retrieval-{seed}-{split}")
    return [
        CaptionedImage(i, (rng.choice(CAPTION_TEMPLATES).format(color=c, shape=s),), f"{c} {s}")
        for i, (c, s) in color_and_shape(split).items()
    ]


class RetrievalPairs(torch.utils.data.Dataset):
    """One item per (image, caption) pair: caption ids, the image's regions and its group id; with an
    :attr:`image_reader` (a model with a visual backbone: :func:`vlbert.recipes.regions.attach_images` sets it), also
    the image's ``pixels`` (:func:`~vlbert.data.regions.with_pixels`).

    Raises:
        ValueError: an image has no regions.
    """

    def __init__(
        self,
        images: Sequence[CaptionedImage],
        regions: dict[str, Regions],
        tokenizer,
        max_text_length: int = 32,
        max_regions: int = 36,
    ):
        missing = [im.image_id for im in images if im.image_id not in regions]
        if missing:
            raise ValueError(f"{len(missing)} images have no regions (e.g. {missing[:3]}); extract them first")
        groups = {g: k for k, g in enumerate(sorted({im.group or im.image_id for im in images}))}
        self.pairs = [(im, c, groups[im.group or im.image_id]) for im in images for c in im.captions]
        self.input_ids = tokenizer([c for _, c, _ in self.pairs], truncation=True, max_length=max_text_length)[
            "input_ids"
        ]
        self.regions, self.max_regions = regions, max_regions

    def __len__(self) -> int:
        return len(self.pairs)

    image_reader = None

    def lengths(self) -> list[int]:
        return [len(ids) for ids in self.input_ids]

    def __getitem__(self, index: int) -> dict:
        image, _, group = self.pairs[index]
        regions = with_pixels(
            region_item(self.regions[image.image_id], self.max_regions), image.image_id, self.image_reader
        )
        return {"input_ids": self.input_ids[index], **regions, "group": group}


class RetrievalCollator:
    """Batches of aligned pairs for :class:`~vlbert.models.vl.VLBertForImageTextRetrieval` training: text
    (:func:`pad_text`), regions (:func:`pad_regions`: ``images``/``image_sizes`` in place of ``region_features``
    where the items carry pixels), ``group_ids`` int64 [B], ``cls_sep_ids`` int64 [2], and the unpadded layouts of
    the model's two single passes, computed on the host so that it never reads a mask on the device
    (:func:`~vlbert.layers.unpadded.unpadded_layout`): ``text_layout`` of the text alone ([B, T] mask) and
    ``image_layout`` of ``[CLS] [SEP]`` + regions ([B, 2 + R])."""

    def __init__(self, tokenizer):
        self.pad_token_id = tokenizer.pad_token_id
        self.cls_sep = torch.tensor([tokenizer.cls_token_id, tokenizer.sep_token_id])

    def __call__(self, items: list[dict]) -> dict:
        batch = pad_text([{"input_ids": x["input_ids"]} for x in items], self.pad_token_id)
        batch.update(pad_regions(items))
        batch["group_ids"] = torch.tensor([x["group"] for x in items])
        batch["cls_sep_ids"] = self.cls_sep
        batch["text_layout"] = unpadded_layout(batch["attention_mask"])
        cls_sep = torch.ones(len(items), 2, dtype=batch["region_mask"].dtype)
        batch["image_layout"] = unpadded_layout(cls_sep, batch["region_mask"])
        return batch


__all__ = ["CaptionedImage", "easy_vqa_captioned", "load_karpathy_split", "RetrievalPairs", "RetrievalCollator"]
