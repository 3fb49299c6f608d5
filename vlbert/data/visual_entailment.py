"""Visual entailment (SNLI-VE, Xie et al. 2019): does the image entail, contradict, or leave undecided a
sentence? Reads the public JSONL format and builds an offline demonstration set from easy-VQA.

SNLI-VE JSONL, one pair per line: ``Flickr30K_ID`` (older releases: ``Flikr30kID``; the image file is
``<id>.jpg``), ``sentence2`` (the hypothesis), ``gold_label`` (entailment / neutral / contradiction), and
``pairID``.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

from vlbert.data.easy_vqa import COLORS, SHAPES, color_and_shape
from vlbert.data.grounded_text import GroundedTextDataset, jsonl_records

LABELS = ("entailment", "neutral", "contradiction")


@dataclass(frozen=True)
class EntailmentExample:
    """One pair: ``pair_id``, ``image_id`` (as in the region shards), ``hypothesis``, ``label`` (index into
    :data:`LABELS`)."""

    pair_id: str
    image_id: str
    hypothesis: str
    label: int


def load_snli_ve(path: str | os.PathLike, image_id_format: str = "{image_id}") -> list[EntailmentExample]:
    """Read an SNLI-VE JSONL file (``snli_ve_train.jsonl`` etc.).

    Args:
        image_id_format: the shard image id from the Flickr30K id, e.g. ``"{image_id}"`` or ``"{image_id}.jpg"``.
    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not JSON, lacks the image id or hypothesis, or has a label outside
            :data:`LABELS`; the message names the file and line.
    """
    out = []
    for where, record in jsonl_records(path, "SNLI-VE"):
        image = record.get("Flickr30K_ID", record.get("Flikr30kID"))
        if image is None or "sentence2" not in record:
            raise ValueError(
                f"{where}: an SNLI-VE line needs Flickr30K_ID (or Flikr30kID) and sentence2; it has {sorted(record)}"
            )
        label = record.get("gold_label")
        if label not in LABELS:
            raise ValueError(f"{where}: gold_label {label!r} is not one of {LABELS}")
        out.append(
            EntailmentExample(
                str(record.get("pairID", where)),
                image_id_format.format(image_id=image),
                record["sentence2"],
                LABELS.index(label),
            )
        )
    if not out:
        raise ValueError(f"{path} holds no pairs")
    return out


#: Statements about what easy-VQA never varies or never shows: not decided by any image.
_UNDECIDED = (
    "the {shape} is made of wood",
    "the {shape} is made of metal",
    "the {color} {shape} was drawn by a child",
    "the picture was taken at night",
    "the {shape} belongs to a teacher",
)


def easy_vqa_entailment(split: str, seed: int = 0) -> list[EntailmentExample]:
    """SNLI-VE-shaped pairs over easy-VQA images: for each image one hypothesis, the label cycling through
    entailment ("there is a blue circle"), contradiction (another colour or shape: "there is a red circle") and
    neutral (a property no easy-VQA image decides: "the circle is made of wood"), so the classes are balanced."""
    rng = random.Random(f"entailment-{seed}-{split}")
    out = []
    for k, (image_id, (color, shape)) in enumerate(color_and_shape(split).items()):
        label = k % 3  # index into LABELS
        if label == 0:
            text = rng.choice(
                (
                    "there is a {color} {shape}",
                    "the image shows a {color} {shape}",
                    "the shape is {color}",
                    "the shape is a {shape}",
                )
            )
        elif label == 2:
            if rng.random() < 0.5:
                color = rng.choice([c for c in COLORS if c != color])
            else:
                shape = rng.choice([s for s in SHAPES if s != shape])
            text = rng.choice(("there is a {color} {shape}", "the image shows a {color} {shape}"))
        else:
            text = rng.choice(_UNDECIDED)
        out.append(EntailmentExample(f"{split}-{k}", image_id, text.format(color=color, shape=shape), label))
    return out


class EntailmentDataset(GroundedTextDataset):
    """Hypotheses joined with their image's regions; target ``labels`` (index into :data:`LABELS`).

    Raises:
        ValueError: an image without regions (the message names the pair and the fix).
    """

    kind, id_field, text_field = "pair", "pair_id", "hypothesis"

    def targets(self, example, regions) -> dict:
        return {"labels": example.label}


__all__ = ["LABELS", "EntailmentExample", "load_snli_ve", "easy_vqa_entailment", "EntailmentDataset"]
