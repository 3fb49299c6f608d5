"""The easy-VQA dataset (Victor Zhou, 2020): 5,000 64x64 PNG images of one coloured shape, 48,248 questions
over 13 answers, train/test split shipped by the ``easy-vqa`` package.

Image ids here are ``"<split>/<n>"``. :func:`image_attributes` recovers each image's colour and shape from its
own question/answer pairs (e.g. "what color is the shape?" -> "blue", "does the image contain a circle?" -> "yes"),
which gives a caption per image ("a blue circle") for image-text pretraining.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from vlbert.common.dependencies import extra_install, require
from vlbert.detectors.cache import cached_shards

COLORS = ("red", "green", "blue", "black", "gray", "teal", "brown", "yellow")
SHAPES = ("circle", "rectangle", "triangle")
SPLITS = ("train", "test")
CAPTION_TEMPLATES = (
    "a {color} {shape}",
    "a {color} {shape} in the image",
    "there is a {color} {shape}",
    "the image shows a {color} {shape}",
    "a picture of a {color} {shape}",
)


@dataclass(frozen=True)
class Question:
    """One easy-VQA question: ``question`` (str), ``answer`` (one of the 13 answers), ``image_id`` ("split/n")."""

    question: str
    answer: str
    image_id: str


def easy_vqa_dir() -> Path:
    """The package's data directory (``train/``, ``test/``, ``answers.txt``).

    Raises:
        ModuleNotFoundError: easy-vqa is not installed; the message names the install.
    """
    package = require("easy_vqa", "the easy-VQA dataset", extra_install("demo", "easy-vqa"))
    return Path(package.__file__).parent / "data"


def load_questions(split: str) -> list[Question]:
    """All questions of ``split`` ("train": 38,575; "test": 9,673).

    Raises:
        ValueError: unknown split.
    """
    if split not in SPLITS:
        raise ValueError(f"easy-VQA split must be one of {SPLITS}, got {split!r}")
    return list(_questions(split))


@functools.lru_cache(maxsize=None)
def _questions(split: str) -> tuple[Question, ...]:
    """The package's questions of ``split``, read once per process (the package's files do not change; the
    questions are frozen): a run reads them several times, and so do the tests."""
    raw = json.loads((easy_vqa_dir() / split / "questions.json").read_text())
    return tuple(Question(q, a, f"{split}/{i}") for q, a, i in raw)


def image_paths(split: str) -> dict[str, Path]:
    """image id -> PNG path for ``split``, in numeric order (a new dict each call; the folder is listed once per
    process)."""
    return dict(_image_paths(split))


@functools.lru_cache(maxsize=None)
def _image_paths(split: str) -> tuple[tuple[str, Path], ...]:
    folder = easy_vqa_dir() / split / "images"
    paths = {f"{split}/{p.stem}": p for p in folder.glob("*.png")}
    return tuple(sorted(paths.items(), key=lambda kv: int(kv[0].split("/")[1])))


def first_images(split: str, count: int = 0) -> list[str]:
    """The ids of the first ``count`` images of ``split`` in numeric order ("train/0", "train/1", ...; 0 = all):
    the image set a run of the first N images uses, whichever task it is (VL pretraining's ``data.max_images``,
    VQA's ``data.max_train_images``), so that runs of the same N share one region cache."""
    ids = list(image_paths(split))
    return ids[:count] if count else ids


def easy_vqa_shards(detector, cache_dir: str | Path, image_ids: list[str] | None = None) -> list[Path]:
    """Region shards of the easy-VQA images (default: all, train and test), extracted once with ``detector``
    (a :class:`vlbert.detectors.config.DetectorConfig`) and cached under ``cache_dir`` (see
    :func:`vlbert.detectors.cache.cached_shards`).

    Each split's images are cached on their own (one directory for the given ids of ``train``, one for those of
    ``test``), so a run that needs the test split beside its training images (VQA's evaluation) reuses the
    training images' regions that another run extracted (VL pretraining on the same ``first_images``). Returns
    the shard paths, train's first; they lie in one directory per split present in ``image_ids``. The cache
    is keyed by the set of ids, whatever their order.

    Raises:
        KeyError: an image id that is not the package's.
    """
    paths = {**image_paths("train"), **image_paths("test")}
    ids = set(paths) if image_ids is None else set(image_ids)
    unknown = sorted(ids - set(paths))
    if unknown:
        raise KeyError(f'{unknown[0]!r} is not an image of the easy-VQA package (ids "train/<n>", "test/<n>")')
    shards = []
    for split in SPLITS:  # the set decides the cache, not the order it was given in: numeric order per split
        mine = [i for i in paths if i in ids and i.startswith(split + "/")]
        if mine:
            shards += cached_shards(detector, {i: paths[i] for i in mine}, cache_dir, "easy-vqa")
    return shards


def answers() -> list[str]:
    """The 13 answers in the package's order."""
    return [a.strip() for a in (easy_vqa_dir() / "answers.txt").read_text().splitlines() if a.strip()]


def image_attributes(questions: list[Question]) -> dict[str, dict[str, str]]:
    """Each image's colour and shape as stated by its questions and answers.

    Open questions give the attribute directly ("what color is the shape?" -> colour; "what is the blue shape?"
    -> shape, and the colour named in the question). A yes/no question about a colour or shape asserts it when the
    answer is "yes" without a negation ("not", "no"), or "no" with one. Returns image id -> {"color": ..., "shape": ...} with the
    keys it could recover.
    """
    out: dict[str, dict[str, str]] = {}
    for q in questions:
        words = q.question.rstrip("?").split()
        attrs = out.setdefault(q.image_id, {})
        colors = [w for w in words if w in COLORS]
        shapes = [w for w in words if w in SHAPES]
        if q.answer in COLORS:
            attrs["color"] = q.answer
            if shapes:
                attrs["shape"] = shapes[0]
        elif q.answer in SHAPES:
            attrs["shape"] = q.answer
            if colors:
                attrs["color"] = colors[0]
        elif q.answer in ("yes", "no"):
            negated = "not" in words or "no" in words  # "is there not a ...", "is no brown shape present?"
            asserted = (q.answer == "yes") != negated
            if asserted:
                if colors:
                    attrs["color"] = colors[0]
                if shapes:
                    attrs["shape"] = shapes[0]
    return out


def color_and_shape(split: str, attributes: dict[str, dict[str, str]] | None = None) -> dict[str, tuple[str, str]]:
    """image id -> (colour, shape) for the images of ``split`` whose colour and shape are both known (a new dict each
    call; from the split's own questions, computed once per process, unless ``attributes`` are given)."""
    if attributes is None:
        return dict(_split_color_and_shape(split))
    return {
        i: (a["color"], a["shape"])
        for i, a in attributes.items()
        if "color" in a and "shape" in a and i.startswith(split + "/")
    }


@functools.lru_cache(maxsize=None)
def _split_color_and_shape(split: str) -> tuple[tuple[str, tuple[str, str]], ...]:
    return tuple(color_and_shape(split, image_attributes(load_questions(split))).items())


__all__ = [
    "Question",
    "SPLITS",
    "load_questions",
    "image_paths",
    "first_images",
    "easy_vqa_shards",
    "answers",
    "image_attributes",
    "color_and_shape",
    "COLORS",
    "SHAPES",
    "CAPTION_TEMPLATES",
    "easy_vqa_dir",
]
