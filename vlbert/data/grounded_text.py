"""The shape every VL fine-tuning dataset shares: examples of a text about one or more images, each image's
regions looked up (and checked) once, the texts tokenised once, and the one collator that pads them
(:class:`GroundedCollator`, told the task's target keys)."""

from __future__ import annotations

import os
from typing import Any, Iterator, Sequence

from torch.utils.data import Dataset

from vlbert.common.user_files import read_jsonl
from vlbert.detectors.regions import Regions
from vlbert.detectors.store import region_count
from vlbert.processing import VLProcessor


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
    (:func:`vlbert.processing.regions.region_item`: region_features float16 [R, D], region_boxes float32 [R, 4] normalised
    xyxy; with an :attr:`image_reader`, also ``pixels``) or, with ``images_per_text`` > 1, ``images`` (a list of such
    items), the task's targets and ``index``.

    Args:
        examples: the task's examples (each with an id attribute named by ``id_field``).
        regions: image id -> :class:`~vlbert.detectors.regions.Regions`.
        processor: the run's :class:`~vlbert.processing.VLProcessor`, whose rules make every item (its
            tokenisation and truncation, :meth:`~vlbert.processing.VLProcessor.text_ids`; its region limit,
            :meth:`~vlbert.processing.VLProcessor.region_item`).
    Raises:
        ValueError: an image without regions; the message names the example, the image and the fix.
    """

    kind, id_field, text_field = "example", "id", "text"
    images_per_text = 1
    #: for a model with a visual backbone: image id -> pixels (:class:`~vlbert.processing.images.ImageReader`), which
    #: every region item then carries (``pixels``) and the collator pads into ``images`` / ``image_sizes``.
    image_reader = None

    def __init__(self, examples: Sequence, regions: dict[str, Regions], processor: VLProcessor):
        for ex in examples:
            for image in self.images(ex):
                if image not in regions:
                    raise ValueError(
                        f"{self.kind} {getattr(ex, self.id_field)} is about image {image!r}, which has no "
                        "regions; extract its regions (vlbert extract) or check "
                        "data.image_id_format"
                    )
        self.examples, self.regions, self.processor = list(examples), regions, processor
        self.input_ids = processor.text_ids([self.text(ex) for ex in self.examples])

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
            self.processor.region_item(r, i, self.image_reader) for r, i in zip(regions, self.images(ex), strict=True)
        ]
        padded = items[0] if self.images_per_text == 1 else {"images": items}
        return {"input_ids": self.input_ids[index], **padded, **self.targets(ex, regions), "index": index}

    def lengths(self) -> list[int]:
        """Positions of every example (wordpieces + regions kept, for length-grouped batching)."""
        return [
            len(ids) + sum(self.processor.kept_regions(region_count(self.regions, i)) for i in self.images(ex))
            for ids, ex in zip(self.input_ids, self.examples, strict=True)
        ]


__all__ = ["GroundedTextDataset", "jsonl_records"]
