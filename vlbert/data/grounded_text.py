"""The shape every VL fine-tuning dataset shares: examples of a text about one or more images, each image's
regions looked up (and checked) once, the texts tokenised once, and the one collator that pads them
(:class:`GroundedCollator`, told the task's target keys)."""

from __future__ import annotations

import os
from typing import Any, Iterator, Sequence

import torch
from torch.utils.data import Dataset

from vlbert.common.user_files import read_jsonl
from vlbert.data.padding import pad_text
from vlbert.data.regions import pad_regions, region_item, with_pixels
from vlbert.detectors.regions import Regions
from vlbert.detectors.store import region_count
from vlbert.layers.unpadded import unpadded_layout


def jsonl_records(path: str | os.PathLike, what: str) -> Iterator[tuple[str, dict]]:
    """(``file:line``, record) for every non-empty line of a JSON-lines file.

    Raises:
        FileNotFoundError: no such file (``what`` names the format, e.g. "NLVR2").
        ValueError: a line that is not JSON (named by file and line).
    """
    yield from read_jsonl(path, f"{what} file")


class GroundedTextDataset(Dataset):
    """Base class of every region task's dataset: examples of a text about one or more images, each image's
    regions looked up (and checked) once, the texts tokenised once.

    Subclasses set ``kind`` (how an example is named in errors), ``id_field`` (its id attribute), ``text_field``
    (its text attribute) and ``images_per_text``, implement :meth:`targets`, and override :meth:`images` where an
    example has more than its ``image_id``.

    Items (for :class:`GroundedCollator`): ``input_ids`` (list of int), the image's region item
    (:func:`vlbert.data.regions.region_item`: region_features float16 [R, D], region_boxes float32 [R, 4] normalised
    xyxy; with an :attr:`image_reader`, also ``pixels``) or, with ``images_per_text`` > 1, ``images`` (a list of such
    items), the task's targets and ``index``.

    Args:
        examples: the task's examples (each with an id attribute named by ``id_field``).
        regions: image id -> :class:`~vlbert.detectors.regions.Regions`.
        tokenizer: WordPiece tokenizer; texts are truncated to ``max_text_length`` wordpieces ([CLS]/[SEP] incl.).
        max_regions: regions kept per image.
    Raises:
        ValueError: an image without regions; the message names the example, the image and the fix.
    """

    kind, id_field, text_field = "example", "id", "text"
    images_per_text = 1
    #: for a model with a visual backbone: image id -> pixels (:class:`~vlbert.data.images.ImageReader`), which
    #: every region item then carries (``pixels``) and the collator pads into ``images`` / ``image_sizes``.
    image_reader = None

    def __init__(
        self,
        examples: Sequence,
        regions: dict[str, Regions],
        tokenizer,
        max_text_length: int = 40,
        max_regions: int = 36,
    ):
        for ex in examples:
            for image in self.images(ex):
                if image not in regions:
                    raise ValueError(
                        f"{self.kind} {getattr(ex, self.id_field)} is about image {image!r}, which has no "
                        "regions; extract its regions (vlbert extract) or check "
                        "data.image_id_format"
                    )
        self.examples, self.regions, self.max_regions = list(examples), regions, max_regions
        texts = [self.text(ex) for ex in self.examples]
        self.input_ids = tokenizer(texts, truncation=True, max_length=max_text_length)["input_ids"] if texts else []

    def text(self, example) -> str:
        """The example's text (question, hypothesis, statement, expression): its ``text_field`` attribute."""
        return getattr(example, self.text_field)

    def images(self, example) -> tuple[str, ...]:
        """The ids of the example's ``images_per_text`` images, in the order the model reads them (default: its
        ``image_id``)."""
        return (example.image_id,)

    def targets(self, example, regions: list[Regions]) -> dict[str, Any]:
        """The example's training targets by batch key (what the task's head takes), e.g. ``{"labels": 2}``;
        ``regions``: its images' regions, read once by ``__getitem__``."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict:
        ex = self.examples[index]
        regions = [self.regions[i] for i in self.images(ex)]  # a store reads each from disk: once per item
        items = [
            with_pixels(region_item(r, self.max_regions), i, self.image_reader)
            for r, i in zip(regions, self.images(ex))
        ]
        padded = items[0] if self.images_per_text == 1 else {"images": items}
        return {"input_ids": self.input_ids[index], **padded, **self.targets(ex, regions), "index": index}

    def lengths(self) -> list[int]:
        """Positions of every example (wordpieces + regions kept, for length-grouped batching)."""
        return [
            len(ids) + sum(min(region_count(self.regions, i), self.max_regions) for i in self.images(ex))
            for ids, ex in zip(self.input_ids, self.examples)
        ]


class GroundedCollator:
    """Pads :class:`GroundedTextDataset` items into one batch: the one collator of every region task, told
    which target keys its task has.

    Returns input_ids / token_type_ids / attention_mask int64 [B, T] (:func:`vlbert.data.padding.pad_text`);
    region_features float16 [B, R, D], region_boxes float32 [B, R, 4] (normalised xyxy), region_mask int64 [B, R]
    (:func:`vlbert.data.regions.pad_regions`), or with ``images_per_text`` = n > 1 [B, n, R, ...] (image 0 first,
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


__all__ = ["GroundedTextDataset", "GroundedCollator", "jsonl_records"]
