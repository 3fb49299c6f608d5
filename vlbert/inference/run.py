"""What every pipeline shares: a trained run directory read back (model, tokenizer, ``inference.json``), the
detector that made its regions rebuilt and checked, and images of any kind turned into model inputs.

A run directory is what a fine-tuning or pretraining run writes (``--output-dir``): ``config.json`` +
``model.safetensors`` + the tokenizer, and ``inference.json`` (:func:`vlbert.recipes.runner.write_inference_info`):
the task, label names, maximum lengths and the regions' detector provenance (fingerprint, configuration, extractor
name). Features from another extractor than the one a model was trained on are this field's classic silent
error, so a pipeline refuses them, naming both detectors, unless told ``allow_other_detector=True``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from detectors.config import DetectorConfig
from detectors.extract import extract_regions
from detectors.images import read_image
from detectors.regions import Regions
from vlbert.data.images import ImagePreprocessing, with_image
from vlbert.data.padding import pad_text
from vlbert.data.regions import pad_regions, region_item
from vlbert.hub import hub_snapshot, is_hub_name
from vlbert.run_files import INFERENCE_INFO
from vlbert.tokenization import load_tokenizer
from vlbert_base.user_files import expect, read_json

#: What a pipeline takes as an image: a file path, a PIL image, a uint8 array [H, W, 3] (RGB), or the image's
#: :class:`~detectors.regions.Regions` already extracted (checked against the run's detector).
ImageInput = Any


def local_run_dir(run_dir: str | os.PathLike) -> Path:
    """The directory a run (or model) is read from: ``run_dir`` itself, or for a hub repository id (``org/name``)
    its snapshot in the hub cache (:func:`vlbert.hub.hub_snapshot`; ``HF_HUB_OFFLINE=1``: the cache only).

    Raises:
        FileNotFoundError: a hub id that is neither cached nor reachable.
    """
    return hub_snapshot(str(run_dir)) if is_hub_name(run_dir) else Path(run_dir).expanduser()


def read_inference_info(run_dir: str | os.PathLike) -> dict[str, Any]:
    """``run_dir/inference.json`` as a dict (``run_dir``: a directory or hub id, :func:`local_run_dir`).

    Raises:
        FileNotFoundError: no such file (not a run directory, or a run written before inference.json existed:
            train again, or write the file by hand with the fields :mod:`vlbert.inference.run` lists).
        ValueError: the file is not JSON or has no ``task``.
    """
    path = local_run_dir(run_dir) / INFERENCE_INFO
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: {run_dir} is not the output directory of a finished run "
            "with regions (tools/finetune*.py and tools/pretrain.py --modality vl write it)"
        )
    fix = "train the run (or convert the checkpoint) again to rewrite it"
    info = expect(read_json(path, "inference.json", fix), dict, str(path), "inference.json", fix)
    if "task" not in info:
        raise ValueError(f"{path} names no task; train the run again to rewrite it")
    return info


def run_pipeline(info: dict[str, Any]) -> str:
    """The pipeline (a :data:`~vlbert.inference.pipelines.PIPELINES` key) a run's inference.json names: its
    ``pipeline`` (the recipe's, :attr:`vlbert.recipes.Recipe.pipeline`), else its ``task``: runs and conversions
    written before recipes named their pipeline, when every pipeline was named after its task."""
    return info.get("pipeline") or info["task"]


def detector_for_run(
    saved: dict[str, Any],
    detector: DetectorConfig | None = None,
    allow_other_detector: bool = False,
    detector_weights: str | os.PathLike | None = None,
) -> DetectorConfig | None:
    """The detector configuration a pipeline extracts with: the run's own (``saved``, the ``detector`` entry of
    inference.json), reading its weights from ``detector_weights`` where given (the file where the user keeps it,
    checked against the recorded sha256, or where none is recorded the file name:
    :meth:`~detectors.config.DetectorConfig.with_weights`); or ``detector`` when it extracts the same features
    (:meth:`~detectors.config.DetectorConfig.difference`) or ``allow_other_detector`` is set.

    Returns None where neither exists (regions imported from precomputed features, no ``detector`` given): such
    a pipeline takes :class:`~detectors.regions.Regions` only.
    Raises:
        ValueError: ``detector`` differs from the run's (both fingerprints named, and what differs) and
            ``allow_other_detector`` is False; ``detector_weights`` are other weights, or come with ``detector``
            or with a run whose regions record no detector.
        FileNotFoundError: ``detector_weights`` does not exist.
    """
    own = DetectorConfig.from_record(saved["config"]) if saved.get("config") else None
    if detector_weights is not None:
        if detector is not None:
            raise ValueError(
                "detector_weights locates the run's own detector's weights; a detector of your own "
                "names its weights itself (its weights field): pass one of the two"
            )
        if own is None:
            raise ValueError(
                f"the run's regions were imported from precomputed features "
                f"({saved.get('extractor')}) and name no detector, so detector_weights has nothing to "
                "apply to: pass the images' Regions"
            )
        return own.with_weights(detector_weights)
    if detector is None:
        return own
    why = own.difference(detector) if own is not None else "the run records no detector"
    if why is not None and not allow_other_detector:
        raise ValueError(
            f"the run was trained on regions of detector {saved.get('fingerprint')} ({saved.get('extractor')}), "
            f"but the given detector is {detector.fingerprint()} ({detector.backend}): {why}; features of another "
            "extractor silently degrade every prediction: leave detector unset to use the run's own, or pass "
            "allow_other_detector=True (--allow-other-detector) to override"
        )
    return detector


class RunInputs:
    """A run's tokenizer, limits and detector, turning texts and images into model inputs.

    Built from a run directory (``RunInputs(run_dir, ...)``) or, for a model in memory, from what stands in for the
    run's files (:meth:`for_model`).

    Args:
        run_dir: the run's output directory.
        detector: another detector configuration (refused unless its fingerprint is the run's, or
            ``allow_other_detector``).
        allow_other_detector: accept ``detector`` and :class:`Regions` from another extractor (at your own risk).
        device: where the detector runs ("cpu", "cuda").
        detector_weights: where the run's detector's weights file is on this machine (checked against the
            recorded sha256; see :func:`detector_for_run`).
    Raises:
        FileNotFoundError, ValueError: from :func:`read_inference_info` and :func:`detector_for_run`.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        detector: DetectorConfig | None = None,
        allow_other_detector: bool = False,
        device: str = "cpu",
        detector_weights: str | os.PathLike | None = None,
    ):
        self.run_dir: Path | None = local_run_dir(run_dir)
        info = read_inference_info(self.run_dir)
        detector = detector_for_run(info.get("detector") or {}, detector, allow_other_detector, detector_weights)
        self._setup(info, load_tokenizer(self.run_dir), detector, allow_other_detector, device)
        self._weights_checked = detector_weights is not None

    @classmethod
    def for_model(
        cls, info: dict[str, Any], tokenizer, detector: DetectorConfig | None = None, device: str = "cpu"
    ) -> "RunInputs":
        """Inputs of a model in memory, which has no run directory: ``info`` stands in for its inference.json
        (``task``, ``labels``, ``max_text_length``, ``max_regions``, ``region_feature_dim``), ``tokenizer`` for its
        saved tokenizer, and ``detector`` (None: the pipeline takes :class:`Regions` only) is taken as the one its
        regions came from: nothing records another to check it against."""
        inputs = cls.__new__(cls)
        inputs.run_dir = None
        inputs._setup(info, tokenizer, detector, False, device)
        inputs._weights_checked = False
        return inputs

    def _setup(
        self, info: dict[str, Any], tokenizer, detector: DetectorConfig | None, allow_other_detector: bool, device: str
    ) -> None:
        self.info = info
        self.tokenizer = tokenizer
        self.saved_detector = info.get("detector") or {}
        self.detector = detector
        self.allow_other_detector = allow_other_detector
        self.max_text_length = int(info.get("max_text_length", 40))
        self.max_regions = int(info.get("max_regions", 36))
        self.device = device
        record = info.get("image_preprocessing")  # a model with a visual backbone: it reads the pixels too
        self.preprocessing = ImagePreprocessing.from_record(record) if record else None
        self._extractor = None

    @property
    def extractor(self):
        """The detector backend, built on first use (loading weights is the slow part)."""
        if self._extractor is None:
            if self.detector is None:
                raise ValueError(
                    f"the run's regions were imported from precomputed features "
                    f"({self.saved_detector.get('extractor')}), so no detector can be rebuilt from it: "
                    "pass the images' Regions, or a detector with allow_other_detector=True"
                )
            weights = Path(self.detector.weights).expanduser()
            if self.detector.weights not in ("", "DEFAULT") and not weights.is_file():
                raise FileNotFoundError(
                    f"the run's detector reads weights {self.detector.weights}, which are not on this machine: pass "
                    f"where you keep {weights.name}: pipeline(run, detector_weights=PATH) (tools/predict.py "
                    "--detector-weights PATH)"
                )
            # the recorded sha256 checked (detector_weights were checked when given)
            detector = self.detector if self._weights_checked else self.detector.identified()
            self._extractor = detector.build(self.device)
        return self._extractor

    def regions(
        self, images: Sequence[ImageInput], boxes: Sequence[np.ndarray | None] | None = None, batch_size: int = 16
    ) -> list[Regions]:
        """Regions of each image, in order: extracted with the run's detector, or checked when given.

        Args:
            images: see :data:`ImageInput`.
            boxes: per image, float32 [N, 4] pixel (x1, y1, x2, y2) boxes to pool instead of detecting (timm backend;
                a run trained on given boxes, e.g. referring expressions over known objects), or None.
        Raises:
            ValueError: a :class:`Regions` from another extractor than the run's (both named), an unreadable image;
                a :class:`Regions` without pixels for a run whose model has a visual backbone.
        Returns:
            one :class:`Regions` per image; for a run whose inference.json records ``image_preprocessing`` (a model
            with a visual backbone), :class:`~vlbert.data.images.ImageRegions` carrying the image's pixels too.
        """
        out: list[Regions | None] = [None] * len(images)
        pending: dict = {}  # key -> (name, source, boxes or None, positions): a file asked about twice is read once
        for k, image in enumerate(images):
            if isinstance(image, Regions):
                if self.preprocessing is not None and getattr(image, "pixels", None) is None:
                    raise ValueError(
                        f"image {image.image_id!r} was given as Regions, but this run's model computes "
                        "its region features from the pixels (model.visual_backbone): pass the image "
                        "itself (a path, PIL image or array)"
                    )
                self._check_regions(image)
                out[k] = image
                continue
            given = None if boxes is None or boxes[k] is None else np.asarray(boxes[k], dtype=np.float32)
            if isinstance(image, (str, os.PathLike)):
                name, source = str(image), image
            else:  # an array, or a PIL image
                name, source = f"image-{k}", read_image(image)  # upright, 8-bit RGB: as the pixels
            key = name if given is None and isinstance(source, (str, os.PathLike)) else k
            pending.setdefault(key, (name, source, given, []))[3].append(k)
        for with_boxes in (False, True):
            group = [p for p in pending.values() if (p[2] is not None) == with_boxes]
            if group:
                given = {name: b for name, _, b, _ in group} if with_boxes else None
                extracted = extract_regions(
                    self.extractor,
                    [(name, source) for name, source, _, _ in group],
                    batch_size,
                    boxes=given,
                    progress=False,
                )
                for (_, _, _, positions), regions in zip(group, extracted):
                    for k in positions:
                        out[k] = regions
        return out if self.preprocessing is None else self._with_pixels(images, out)

    def _with_pixels(self, images: Sequence[ImageInput], regions: list[Regions]) -> list[Regions]:
        """Each image's regions with its pixels through the run's preprocessing
        (:class:`~vlbert.data.images.ImageRegions`; given ones already carry theirs), for a run whose model has a
        visual backbone."""
        return [
            found if isinstance(image, Regions) else with_image(found, self.preprocessing.read(image))
            for image, found in zip(images, regions)
        ]

    def _check_regions(self, regions: Regions) -> None:
        expected = self.saved_detector.get("extractor")
        if expected and regions.detector and regions.detector != expected and not self.allow_other_detector:
            raise ValueError(
                f"image {regions.image_id!r} has regions of {regions.detector}, but the run was trained "
                f"on regions of {expected} (detector {self.saved_detector.get('fingerprint')}); extract "
                "them with the run's detector (pass the image itself), or pass allow_other_detector=True"
            )
        dim = self.info.get("region_feature_dim")
        if dim and regions.feature_dim != dim:
            raise ValueError(
                f"image {regions.image_id!r} has {regions.feature_dim}-dimensional region features; the "
                f"model reads {dim}: extract them with the run's detector"
            )

    def region_items(self, regions: Sequence[Regions]) -> list[dict]:
        """Each image's first ``max_regions`` regions as dataset items (:func:`vlbert.data.regions.region_item`)."""
        return [region_item(r, self.max_regions) for r in regions]

    def text_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Wordpiece ids of each text with [CLS]/[SEP], truncated to the run's maximum length (as its dataset)."""
        return self.tokenizer(list(texts), truncation=True, max_length=self.max_text_length)["input_ids"]

    def text_batch(self, texts: Sequence[str], device) -> dict[str, torch.Tensor]:
        """``texts`` tokenised as the run's dataset (:meth:`text_ids`) and padded (:func:`pad_text`) on ``device``:
        input_ids, token_type_ids, attention_mask int64 [B, T]."""
        batch = pad_text([{"input_ids": x} for x in self.text_ids(texts)], self.tokenizer.pad_token_id)
        return {k: v.to(device) for k, v in batch.items()}

    def region_batch(self, regions: Sequence[Regions], device) -> dict[str, torch.Tensor]:
        """Each image's first ``max_regions`` regions, padded (:func:`pad_regions`) on ``device``: region_features
        float16 [B, R, D], region_boxes float32 [B, R, 4] normalised, region_mask int64 [B, R]; for regions with
        pixels (:class:`~vlbert.data.images.ImageRegions`) images float32 [B, 3, H, W] and image_sizes int64 [B, 2]
        in place of region_features, as the run's collator gave them in training."""
        return {k: v.to(device) for k, v in pad_regions(self.region_items(regions)).items()}

    def batch(self, texts: Sequence[str], regions: Sequence[Regions], device) -> dict[str, torch.Tensor]:
        """One (text, image) pair per row: :meth:`text_batch` and :meth:`region_batch` together."""
        return {**self.text_batch(texts, device), **self.region_batch(regions, device)}


__all__ = ["RunInputs", "read_inference_info", "run_pipeline", "local_run_dir", "detector_for_run", "ImageInput"]
