"""NLVR2 (Suhr et al. 2019): is a statement true of a pair of images? Reads the public JSONL format and builds an
offline demonstration set from pairs of easy-VQA images.

NLVR2 JSONL, one statement per line: ``identifier`` ``<split>-<set>-<pair>-<sentence>`` (e.g.
``dev-850-0-0``), ``sentence``, ``label`` ("True" / "False"); the two images are
``<split>-<set>-<pair>-img0`` (left) and ``-img1`` (right).
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass

from vlbert.data.easy_vqa import COLORS, SHAPES, color_and_shape
from vlbert.data.grounded_text import GroundedTextDataset, jsonl_records

_IDENTIFIER = re.compile(r"^(?P<split>[a-z0-9]+)-(?P<set>\d+)-(?P<pair>\d+)-(?P<sentence>\d+)$")
_LABELS = {"True": 1, "False": 0, True: 1, False: 0}


@dataclass(frozen=True)
class ImagePairExample:
    """One statement about two images: ``identifier``, ``sentence``, ``left_image``/``right_image`` (ids as in the
    region shards) and ``label`` (1 = true of the pair)."""

    identifier: str
    sentence: str
    left_image: str
    right_image: str
    label: int


def load_nlvr2(path: str | os.PathLike, image_id_format: str = "{stem}-img{k}") -> list[ImagePairExample]:
    """Read an NLVR2 JSONL file (``train.json``, ``dev.json``, ``test1.json``).

    Args:
        image_id_format: the shard image id of image k (0 = left, 1 = right) from ``stem`` =
            ``<split>-<set>-<pair>``, e.g. ``"{stem}-img{k}"`` (the NLVR2 file names without ``.png``).
    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not JSON, lacks a field, has a malformed identifier or a label other than
            "True"/"False"; the message names the file and line.
    """
    out = []
    for where, record in jsonl_records(path, "NLVR2"):
        missing = [k for k in ("identifier", "sentence", "label") if k not in record]
        if missing:
            raise ValueError(f"{where}: an NLVR2 line needs identifier, sentence and label; {missing} missing")
        match = _IDENTIFIER.match(str(record["identifier"]))
        if match is None:
            raise ValueError(
                f"{where}: identifier {record['identifier']!r} is not <split>-<set>-<pair>-<sentence> "
                "(e.g. dev-850-0-0)"
            )
        if record["label"] not in _LABELS:
            raise ValueError(f"{where}: label {record['label']!r} is not 'True' or 'False'")
        stem = f"{match['split']}-{match['set']}-{match['pair']}"
        out.append(
            ImagePairExample(
                record["identifier"],
                record["sentence"],
                image_id_format.format(stem=stem, k=0),
                image_id_format.format(stem=stem, k=1),
                _LABELS[record["label"]],
            )
        )
    if not out:
        raise ValueError(f"{path} holds no statements")
    return out


def _statement(rng: random.Random, left: tuple[str, str], right: tuple[str, str], want: bool) -> str | None:
    """A statement about two (colour, shape) images whose truth is ``want``, or None if this template cannot."""
    kind = rng.randrange(4)
    if kind == 0:  # both images show a <shape>
        candidates = [s for s in SHAPES if (left[1] == s and right[1] == s) == want]
        return f"both images show a {rng.choice(candidates)}" if candidates else None
    if kind == 1:  # the left image has a <colour> shape and the right one does not
        candidates = [c for c in COLORS if (left[0] == c and right[0] != c) == want]
        return f"the left image has a {rng.choice(candidates)} shape and the right one does not" if candidates else None
    if kind == 2:  # exactly one image shows a <shape>
        candidates = [s for s in SHAPES if ((left[1] == s) != (right[1] == s)) == want]
        return f"exactly one image shows a {rng.choice(candidates)}" if candidates else None
    candidates = [c for c in COLORS if (left[0] == c and right[0] == c) == want]  # both shapes are <colour>
    return f"both shapes are {rng.choice(candidates)}" if candidates else None


def easy_vqa_image_pairs(split: str, count: int, seed: int = 0) -> list[ImagePairExample]:
    """``count`` NLVR2-shaped statements over random pairs of easy-VQA images of ``split``, labels from the
    images' annotations, half true and half false. A third of the pairs share the shape and a third the colour,
    so that "both ..." statements are true often enough to be learned."""
    truth = color_and_shape(split)
    ids = list(truth)
    by_shape: dict[str, list[str]] = {}
    by_color: dict[str, list[str]] = {}
    for i, (color, shape) in truth.items():
        by_shape.setdefault(shape, []).append(i)
        by_color.setdefault(color, []).append(i)
    rng = random.Random(f"nlvr2-{seed}-{split}")
    out = []
    while len(out) < count:
        left = rng.choice(ids)
        pool = (ids, by_shape[truth[left][1]], by_color[truth[left][0]])[len(out) % 3]
        right = rng.choice(pool)
        want = len(out) % 2 == 0
        sentence = _statement(rng, truth[left], truth[right], want)
        if sentence is not None and right != left:
            out.append(ImagePairExample(f"{split}-{len(out)}-0-0", sentence, left, right, int(want)))
    return out


class ImagePairDataset(GroundedTextDataset):
    """Statements joined with both images' regions.

    Items: input_ids, ``images`` (the two images' region items, left first), ``labels`` (1 = true) and ``index``.
    Raises:
        ValueError: an image without regions (the message names the statement and the fix).
    """

    kind, id_field, text_field = "statement", "identifier", "sentence"
    images_per_text = 2

    def images(self, example) -> tuple[str, ...]:
        return (example.left_image, example.right_image)

    def targets(self, example, regions) -> dict:
        return {"labels": example.label}


__all__ = ["ImagePairExample", "load_nlvr2", "easy_vqa_image_pairs", "ImagePairDataset"]
