"""The shape every VL fine-tuning dataset shares: examples of a text about one or more images, each image's
regions looked up (and checked) once, the texts tokenised once."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator, Sequence

from torch.utils.data import Dataset

from detectors.regions import Regions


def jsonl_records(path: str | os.PathLike, what: str) -> Iterator[tuple[str, dict]]:
    """(``file:line``, record) for every non-empty line of a JSON-lines file.

    Raises:
        FileNotFoundError: no such file (``what`` names the format, e.g. "NLVR2").
        ValueError: a line that is not JSON (named by file and line).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file {path} does not exist")
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{line_no}", json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{line_no}: not a JSON line ({e})") from e


class GroundedTextDataset(Dataset):
    """Base class: subclasses set ``kind`` (how an example is named in errors) and implement :meth:`text`,
    :meth:`images` and ``__getitem__`` (with ``self.input_ids[index]`` and ``self.regions``).

    Args:
        examples: the task's examples (each with an id attribute named by ``id_field``).
        regions: image id -> :class:`~detectors.regions.Regions`.
        tokenizer: WordPiece tokenizer; texts are truncated to ``max_text_length`` wordpieces ([CLS]/[SEP] incl.).
        max_regions: regions kept per image.
    Raises:
        ValueError: an image without regions; the message names the example, the image and the fix.
    """

    kind, id_field = "example", "id"

    def __init__(self, examples: Sequence, regions: dict[str, Regions], tokenizer, max_text_length: int = 40,
                 max_regions: int = 36):
        for ex in examples:
            for image in self.images(ex):
                if image not in regions:
                    raise ValueError(f"{self.kind} {getattr(ex, self.id_field)} is about image {image!r}, which has no "
                                     "regions; extract its regions (tools/extract_regions.py) or check "
                                     "data.image_id_format")
        self.examples, self.regions, self.max_regions = list(examples), regions, max_regions
        self.input_ids = tokenizer([self.text(ex) for ex in self.examples], truncation=True,
                                   max_length=max_text_length)["input_ids"]

    def text(self, example) -> str:
        raise NotImplementedError

    def images(self, example) -> tuple[str, ...]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.examples)

    def lengths(self) -> list[int]:
        """Wordpieces of every text (for length-grouped batching)."""
        return [len(ids) for ids in self.input_ids]


__all__ = ["GroundedTextDataset", "jsonl_records"]
