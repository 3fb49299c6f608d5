"""The collators of the region tasks: :class:`GroundedCollator` pads a processor's items (a text about one or more
images) into the model's batch, in training and at inference alike; :class:`RetrievalCollator` pads retrieval's
aligned pairs with the layouts of the model's two single passes."""

from __future__ import annotations

from typing import Sequence

import torch

from vlbert.layers.unpadded import regions_alone_layout, unpadded_layout
from vlbert.processing.padding import pad_text
from vlbert.processing.regions import pad_regions


class GroundedCollator:
    """Pads :class:`~vlbert.data.grounded_text.GroundedTextDataset` items into one batch: the one collator of every
    region task, told which target keys its task has.

    Returns input_ids / token_type_ids / attention_mask int64 [B, T] (:func:`vlbert.processing.padding.pad_text`);
    region_features float16 [B, R, D], region_boxes float32 [B, R, 4] (normalised xyxy), region_mask int64 [B, R]
    (:func:`vlbert.processing.regions.pad_regions`), or with ``images_per_text`` = n > 1 [B, n, R, ...] (image 0 first,
    every image padded to the batch's largest R); each of ``target_keys`` stacked over the items (ints -> int64
    [B], arrays -> [B, ...] of their dtype); ``index`` int64 [B] (the items' dataset indices); with one image
    per text, the unpadded layout of [text ; regions] (``layout``:
    :func:`~vlbert.layers.unpadded.unpadded_layout`, computed on the host so the model never reads the masks on the
    device; a two-stream model runs it padded, VL-BERT's pathway extends it by its [END] on the device); with n
    images per text, the layout of the B * n rows (text i ; image j) in that order, as
    :class:`~vlbert.models.vl_classification.VLBertForImagePairClassification` encodes them.

    Args:
        tokenizer: gives ``pad_token_id``.
        target_keys: the items' target keys (e.g. ``("labels",)``, ``("target_region", "target_box")``).
        images_per_text: images per item (2: NLVR2's image pairs, items carrying ``images``).
    """

    def __init__(self, tokenizer, target_keys: Sequence[str] = ("labels",), images_per_text: int = 1):
        self.pad_token_id = tokenizer.pad_token_id
        self.target_keys = tuple(target_keys)
        self.images_per_text = images_per_text

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        batch = pad_text([{"input_ids": x["input_ids"]} for x in items], self.pad_token_id)
        if self.images_per_text == 1:
            batch.update(pad_regions(items))
            batch["layout"] = unpadded_layout(batch["attention_mask"], batch["region_mask"])
        else:
            regions = pad_regions([image for x in items for image in x["images"]])
            batch.update({k: v.view(len(items), self.images_per_text, *v.shape[1:]) for k, v in regions.items()})
            # the model encodes each text once with each image: rows (text i ; its image j), i-major
            text_mask = batch["attention_mask"].repeat_interleave(self.images_per_text, 0)
            batch["layout"] = unpadded_layout(text_mask, regions["region_mask"])
        for key in self.target_keys:
            batch[key] = torch.stack([torch.as_tensor(x[key]) for x in items])
        batch["index"] = torch.tensor([x["index"] for x in items])
        return batch


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
        batch["image_layout"] = regions_alone_layout(batch["region_mask"])
        return batch


__all__ = ["GroundedCollator", "RetrievalCollator"]
