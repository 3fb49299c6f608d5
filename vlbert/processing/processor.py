"""The processor saved with every model (transformers' ``ProcessorMixin`` shape): raw texts and images (or their
regions) -> one batch, exactly as the model's forward takes it and as the training collator gives it.

It owns the input rules a model was trained with, so that training, fine-tuning, the pipelines, the demo and
predict read them from one place:

- the tokenizer and ``max_text_length`` (wordpieces per text, [CLS]/[SEP] included);
- the region source record (:class:`~vlbert.processing.region_source.RegionSource`: the detector's configuration
  with its weights' sha256, its fingerprint, the extractor's name, the feature size) and ``max_regions``;
- for a model with a visual backbone, the image preprocessing (:class:`~vlbert.processing.images.ImagePreprocessing`,
  over :func:`vlbert.detectors.images.read_image`, the one image reader: EXIF orientation, bit depth, modes);
- the task, its pipeline and its label names (VQA's answer vocabulary, ...), and the task's further fields
  (retrieval's ``shortlist``, referring expressions' ``boxes``, ...);
- the compatibility check between two records (:meth:`VLProcessor.check_compatible`).

``save_pretrained(dir)`` writes ``processor.json`` beside ``config.json`` (and the tokenizer);
``from_pretrained(dir)`` reads it back, or for a run or conversion written before the processor existed its
``inference.json`` (:func:`vlbert.run_files.processor_record_file`, the one place that knows the older file).

    processor = VLProcessor.from_pretrained("runs/vqa")
    batch = processor(text=["what color is the shape?"], images=["shape.png"])   # input_ids, region_features, ...
    logits = VLBertForVQA.from_pretrained("runs/vqa")(**batch).logits
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from vlbert.detectors.config import DetectorConfig
from vlbert.detectors.images import read_image
from vlbert.detectors.regions import Regions
from vlbert.processing.collator import GroundedCollator
from vlbert.processing.detection import Detection
from vlbert.processing.images import ImagePreprocessing, backbone_preprocessing, with_image
from vlbert.processing.padding import pad_text
from vlbert.processing.record import load_processor_record, local_run_dir
from vlbert.processing.region_source import RegionSource
from vlbert.processing.regions import pad_regions, region_item, with_pixels
from vlbert.run_files import read_processor_record, write_processor_record
from vlbert.tokenization import load_tokenizer, save_tokenizer

#: What a processor takes as an image: a file path, a PIL image, a uint8 array [H, W, 3] (RGB), or the image's
#: :class:`~vlbert.detectors.regions.Regions` already extracted (checked against the processor's region source).
ImageInput = Any

#: The limits of a record that names none (the VL runs' defaults; BUTD's 36 regions per image).
DEFAULT_MAX_TEXT_LENGTH = 40
DEFAULT_MAX_REGIONS = 36

#: The record's fields the processor reads into attributes; every other field is kept in ``extra`` as it is.
_FIELDS = ("task", "pipeline", "labels", "max_text_length", "max_regions", "region_feature_dim", "detector",
           "image_preprocessing", "processor_class", "format_version")  # fmt: skip


class VLProcessor:
    """A model's input rules, saved beside it, turning texts and images into the model's batch.

    Args:
        tokenizer: the fast WordPiece tokenizer (None: loaded from ``name_or_path`` on first use).
        task: the run's task (a recipe name, e.g. "vqa"); pipeline: its pipeline's name (None: the task's).
        labels: the label names in logit order (VQA's answers, ...), or None.
        max_text_length: wordpieces per text, [CLS]/[SEP] included.
        max_regions: regions kept per image.
        region_source: what made the region features; None: a text-only processor (its model never saw a region).
        image_preprocessing: how an image becomes a visual backbone's pixels; None: the model reads detector
            features only.
        extra: the task's further record fields (``shortlist``, ``boxes``, ``qa_answers``, ``converted_from``, ...).
        name_or_path: where it was read from (messages, and the tokenizer when none is given).
        detection: how images become regions on this machine (:class:`~vlbert.processing.detection.Detection`:
            detector, weights, device); None: the record's own detector on the CPU, built when first needed.
    """

    def __init__(
        self,
        tokenizer=None,
        *,
        task: str | None = None,
        pipeline: str | None = None,
        labels: Sequence[str] | None = None,
        max_text_length: int = DEFAULT_MAX_TEXT_LENGTH,
        max_regions: int = DEFAULT_MAX_REGIONS,
        region_source: RegionSource | None = None,
        image_preprocessing: ImagePreprocessing | None = None,
        extra: dict[str, Any] | None = None,
        name_or_path: str | os.PathLike | None = None,
        detection: Detection | None = None,
    ):
        if tokenizer is None and name_or_path is None:
            raise ValueError("a VLProcessor needs its tokenizer (or the directory to load it from: name_or_path)")
        self._tokenizer = tokenizer
        self.task, self.pipeline = task, pipeline
        self.labels = list(labels) if labels is not None else None
        self.max_text_length, self.max_regions = int(max_text_length), int(max_regions)
        self.region_source = region_source
        self.image_preprocessing = image_preprocessing
        self.extra = dict(extra or {})
        self.name_or_path = name_or_path
        self._detection = detection

    # ------------------------------------------------------------------------------------------------ the record
    @classmethod
    def from_record(cls, record: dict[str, Any], tokenizer=None, name_or_path=None) -> "VLProcessor":
        """The processor a record describes (a saved ``processor.json``, an older ``inference.json``, or a text
        task's record: :func:`vlbert.recipes.runner.run_processor`): a record without a ``detector`` entry is
        text-only.

        Raises:
            ValueError: a bad ``image_preprocessing`` entry.
        """
        preprocessing = record.get("image_preprocessing")
        source = (
            RegionSource.from_record(record["detector"], record.get("region_feature_dim"))
            if "detector" in record
            else None
        )
        return cls(
            tokenizer,
            task=record.get("task"),
            pipeline=record.get("pipeline"),
            labels=record.get("labels"),
            max_text_length=int(record.get("max_text_length") or DEFAULT_MAX_TEXT_LENGTH),
            max_regions=int(record.get("max_regions") or DEFAULT_MAX_REGIONS),
            region_source=source,
            image_preprocessing=ImagePreprocessing.from_record(preprocessing) if preprocessing else None,
            extra={k: v for k, v in record.items() if k not in _FIELDS},
            name_or_path=name_or_path,
        )

    def to_dict(self) -> dict[str, Any]:
        """The record, JSON-ready (what :meth:`save_pretrained` writes): task, pipeline, labels, max_text_length;
        with a region source also max_regions, region_feature_dim and ``detector`` (:meth:`RegionSource.record`);
        image_preprocessing where set; the task's extra fields."""
        out: dict[str, Any] = {}
        if self.task is not None:
            out["task"] = self.task
        if self.pipeline is not None:
            out["pipeline"] = self.pipeline
        if self.labels is not None:
            out["labels"] = list(self.labels)
        out["max_text_length"] = self.max_text_length
        if self.region_source is not None:
            out["max_regions"] = self.max_regions
            out["region_feature_dim"] = self.region_source.feature_dim
            out["detector"] = self.region_source.record()
        if self.image_preprocessing is not None:
            out["image_preprocessing"] = self.image_preprocessing.record()
        return {**out, **self.extra}

    @property
    def info(self) -> dict[str, Any]:
        """:meth:`to_dict` (the record's fields by name: ``info["boxes"]``, ``info.get("shortlist")``)."""
        return self.to_dict()

    def save_pretrained(self, directory: str | os.PathLike, save_tokenizer_files: bool = True) -> Path:
        """Write ``directory/processor.json`` (atomically) and, unless ``save_tokenizer_files`` is False (a run,
        whose trainer saves the tokenizer with the weights), the tokenizer's files. Returns processor.json's path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if save_tokenizer_files:
            save_tokenizer(self.tokenizer, directory)
        return write_processor_record(directory, self.to_dict())

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, tokenizer=None) -> "VLProcessor":
        """The processor saved in ``name_or_path`` (a run or model directory, or hub id): its processor.json, or
        the inference.json of a run or conversion written before it; the tokenizer saved beside it (read on first
        use) unless ``tokenizer`` is given.

        Raises:
            FileNotFoundError, ValueError: from :func:`load_processor_record`.
        """
        directory = local_run_dir(name_or_path)
        return cls.from_record(load_processor_record(directory), tokenizer, directory)

    @classmethod
    def saved(cls, directory: str | os.PathLike | None) -> "VLProcessor | None":
        """The processor saved in the local ``directory`` (an ``init_from``), or None where it holds none (the
        packaged MiniLM, a converted text BERT) or ``directory`` is None.

        Raises:
            ValueError: a damaged record (the file named).
        """
        if directory is None:
            return None
        record = read_processor_record(Path(directory))
        return None if record is None else cls.from_record(record, name_or_path=Path(directory))

    @classmethod
    def for_model(
        cls,
        config,
        tokenizer,
        task: str | None = None,
        labels: Sequence[str] | None = None,
        max_text_length: int | None = None,
        max_regions: int | None = None,
        detector: DetectorConfig | None = None,
    ) -> "VLProcessor":
        """The processor of a model in memory (``config``: its config), which has no saved one: ``labels`` default
        to ``config.id2label``, ``max_text_length`` to the tokenizer's ``model_max_length`` within the model's
        positions, ``max_regions`` to 36; a model with regions takes ``detector`` as the one they came from (None:
        images must be given as :class:`Regions`); a model with a ``visual_backbone`` reads pixels through its
        backbone kind's preprocessing (:func:`~vlbert.processing.images.backbone_preprocessing`)."""
        id2label = getattr(config, "id2label", None)
        if labels is None and id2label:
            labels = [id2label[k] for k in sorted(id2label)]
        positions = int(getattr(config, "max_position_embeddings", 512))
        dim = getattr(config, "region_feature_dim", None)
        backbone = getattr(config, "visual_backbone", None)
        processor = cls(
            tokenizer,
            task=task,
            labels=labels,
            max_text_length=max_text_length or min(int(getattr(tokenizer, "model_max_length", positions)), positions),
            max_regions=max_regions or DEFAULT_MAX_REGIONS,
            region_source=RegionSource.of_detector(detector, dim) if dim else None,
            image_preprocessing=backbone_preprocessing(backbone) if backbone else None,
            detection=Detection(detector),
        )
        return processor

    @property
    def tokenizer(self):
        """The tokenizer (loaded from ``name_or_path`` on first use where none was given)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.name_or_path)
        return self._tokenizer

    @property
    def uses_regions(self) -> bool:
        """Whether the model reads regions (a region source is recorded); False: a text-only processor."""
        return self.region_source is not None

    # ----------------------------------------------------------------------------------------- compatibility
    def check_compatible(self, other: "VLProcessor") -> None:
        """Refuse to start from this processor's model with ``other``'s regions (fine-tuning a checkpoint on
        regions of another detector than its own: the mistake the pipelines refuse at inference). A text-only
        processor on either side is compatible with any (a text checkpoint's region pathway may start on any
        detector's regions: the design card's text-then-vision path). Regions imported without saying what made
        them are refused where this processor records its detector: nothing shows they are its features.

        Raises:
            ValueError (one line): the two region sources differ (both named, and what differs), or ``other``'s
                is unknown while this one's is known; the fix named.
        """
        if self.region_source is None or other.region_source is None:
            return
        trained, here = self.region_source, other.region_source
        where = f"init_from {self.name_or_path}" if self.name_or_path is not None else "the checkpoint"
        if trained.config and not here.known:
            raise ValueError(
                f"{where} was trained on regions of {trained.extractor}, but this run's regions "
                f"({here.extractor}) were imported without saying what extracted them: re-import them with "
                "vlbert extract --from-tsv/--from-npz F --extracted-with NAME (e.g. butd-vg) if that "
                "detector made them, or set allow_other_detector: true (--set allow_other_detector=true)"
            )
        why = trained.difference(here)
        if why is not None:
            raise ValueError(
                f"{where} was trained on regions of detector {trained.fingerprint} ({trained.extractor}), but this "
                f"run's regions come from {here.fingerprint} ({here.extractor}): {why}; features of another "
                "extractor silently degrade the model: extract the regions with its detector (its processor.json "
                "names it), or set allow_other_detector: true (--set allow_other_detector=true)"
            )

    # ---------------------------------------------------------------------------------------------- detection
    @property
    def detection(self) -> Detection:
        """How images become regions (:class:`~vlbert.processing.detection.Detection`): the one given
        (:meth:`use_detector`, or the constructor's), else the record's own detector on the CPU."""
        if self._detection is None:
            self._detection = Detection.for_source(self.region_source)
        return self._detection

    @detection.setter
    def detection(self, value: Detection) -> None:
        self._detection = value

    @property
    def detector(self) -> DetectorConfig | None:
        """The detector that extracts regions from images (:attr:`detection`'s), or None (imported features)."""
        return self.detection.detector

    def use_detector(
        self,
        detector: DetectorConfig | None = None,
        allow_other_detector: bool = False,
        detector_weights: str | os.PathLike | None = None,
        device: str = "cpu",
    ) -> "VLProcessor":
        """Give this processor the :class:`~vlbert.processing.detection.Detection` of its record (arguments and
        errors: :meth:`Detection.for_source <vlbert.processing.detection.Detection.for_source>`). Returns self."""
        self.detection = Detection.for_source(
            self.region_source, detector, allow_other_detector, detector_weights, device
        )
        return self

    def regions(
        self, images: Sequence[ImageInput], boxes: Sequence[np.ndarray | None] | None = None, batch_size: int = 16
    ) -> list[Regions]:
        """Each image's regions, in order: extracted with the detector (:meth:`use_detector`), or checked when
        given as :class:`Regions` (:meth:`check_regions`).

        Args:
            images: see :data:`ImageInput`.
            boxes: per image, float32 [N, 4] pixel (x1, y1, x2, y2) boxes to pool instead of detecting (timm backend;
                a run trained on given boxes, e.g. referring expressions over known objects), or None.
        Raises:
            ValueError: a :class:`Regions` from another extractor than the record's (both named), an unreadable
                image; a :class:`Regions` without pixels for a model with a visual backbone.
        Returns:
            one :class:`Regions` per image; with an image preprocessing (a model with a visual backbone),
            :class:`~vlbert.processing.images.ImageRegions` carrying the image's pixels too.
        """
        out: list[Regions | None] = [None] * len(images)
        pending: dict = {}  # key -> (name, source, boxes or None, positions): a file asked about twice is read once
        for k, image in enumerate(images):
            if isinstance(image, Regions):
                if self.image_preprocessing is not None and getattr(image, "pixels", None) is None:
                    raise ValueError(
                        f"image {image.image_id!r} was given as Regions, but this run's model computes "
                        "its region features from the pixels (model.visual_backbone): pass the image "
                        "itself (a path, PIL image or array)"
                    )
                self.check_regions(image)
                out[k] = image
                continue
            given = None if boxes is None or boxes[k] is None else np.ascontiguousarray(boxes[k], dtype=np.float32)
            if isinstance(image, (str, os.PathLike)):
                name, source = str(image), image
            else:  # an array, or a PIL image
                name, source = f"image-{k}", read_image(image)  # upright, 8-bit RGB: as the pixels
            key = name if given is None and isinstance(source, (str, os.PathLike)) else k
            pending.setdefault(key, (name, source, given, []))[3].append(k)
        for with_boxes in (False, True):
            group = [p for p in pending.values() if (p[2] is not None) == with_boxes]
            if group:
                # Each entry is extracted under an id of its own: a file given twice with two sets of boxes is two
                # entries, and keyed by its name the second set of boxes would pool both.
                ids = [f"{positions[0]}:{name}" for name, _, _, positions in group]
                given = {i: b for i, (_, _, b, _) in zip(ids, group, strict=True)} if with_boxes else None
                sources = [(i, source) for i, (_, source, _, _) in zip(ids, group, strict=True)]
                extracted = self.detection.extract(sources, given, batch_size)
                for (name, _, _, positions), regions in zip(group, extracted, strict=True):
                    for k in positions:
                        out[k] = dataclasses.replace(regions, image_id=name)
        if self.image_preprocessing is None:
            return out
        return [  # each image's pixels through the preprocessing (given Regions already carry theirs)
            found if isinstance(image, Regions) else with_image(found, self.image_preprocessing.read(image))
            for image, found in zip(images, out, strict=True)
        ]

    @property
    def preprocessing(self) -> ImagePreprocessing | None:
        """:attr:`image_preprocessing` (the name the pipelines used)."""
        return self.image_preprocessing

    def check_regions(self, regions: Regions) -> None:
        """Refuse ``regions`` given ready-made that another extractor made than the record's (unless
        ``allow_other_detector``), or whose feature size is not the model's (a model that reads detector features).

        Raises:
            ValueError: as said, both named, with the fix.
        """
        source = self.region_source or RegionSource()
        expected = source.extractor
        allowed = self._detection is not None and self._detection.allow_other_detector
        if expected and regions.detector and regions.detector != expected and not allowed:
            raise ValueError(
                f"image {regions.image_id!r} has regions of {regions.detector}, but the run was trained "
                f"on regions of {expected} (detector {source.fingerprint}); extract "
                "them with the run's detector (pass the image itself), or pass allow_other_detector=True"
            )
        # a model with a visual backbone computes its features from the pixels: the detector's size does not matter
        if source.feature_dim and self.image_preprocessing is None and regions.feature_dim != source.feature_dim:
            raise ValueError(
                f"image {regions.image_id!r} has {regions.feature_dim}-dimensional region features; the "
                f"model reads {source.feature_dim}: extract them with the run's detector"
            )

    # ------------------------------------------------------------------------------------------------ batches
    def region_item(self, regions: Regions, image_id: str | None = None, image_reader=None) -> dict:
        """One image's first ``max_regions`` regions as an item (:func:`vlbert.processing.regions.region_item`):
        region_features float16 [R, D], region_boxes float32 [R, 4] normalised xyxy, class_probs where the shards
        have them; with an ``image_reader`` (:class:`~vlbert.processing.images.ImageReader`, a model with a visual
        backbone) also the ``pixels`` of ``image_id`` (:func:`~vlbert.processing.regions.with_pixels`). Every
        dataset's items come from here: the one home of the region limit."""
        return with_pixels(region_item(regions, self.max_regions), image_id, image_reader)

    def region_items(self, regions: Sequence[Regions]) -> list[dict]:
        """:meth:`region_item` of each image."""
        return [self.region_item(r) for r in regions]

    def kept_regions(self, count: int) -> int:
        """How many of an image's ``count`` regions an item keeps (``max_regions`` at most)."""
        return min(count, self.max_regions)

    def text_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Wordpiece ids of each text with [CLS]/[SEP], truncated to ``max_text_length``: the one home of the
        truncation rule (the datasets, the evaluation and the pipelines all tokenise here)."""
        if not texts:
            return []
        return self.tokenizer(list(texts), truncation=True, max_length=self.max_text_length)["input_ids"]

    def wrap_ids(self, token_ids: Sequence[int]) -> list[int]:
        """Wordpiece ids already tokenised (no special tokens: a caption cache) under the same rule as
        :meth:`text_ids`: [CLS], the first ``max_text_length`` - 2, [SEP]."""
        tokenizer = self.tokenizer
        return [tokenizer.cls_token_id, *token_ids[: self.max_text_length - 2], tokenizer.sep_token_id]

    def text_batch(self, texts: Sequence[str], device=None) -> dict[str, torch.Tensor]:
        """``texts`` tokenised (:meth:`text_ids`) and padded (:func:`pad_text`): input_ids, token_type_ids,
        attention_mask int64 [B, T], on ``device`` (None: the CPU)."""
        batch = pad_text([{"input_ids": x} for x in self.text_ids(texts)], self.tokenizer.pad_token_id)
        return _to(batch, device)

    def region_batch(self, regions: Sequence[Regions], device=None) -> dict[str, torch.Tensor]:
        """Each image's first ``max_regions`` regions, padded (:func:`pad_regions`): region_features float16
        [B, R, D], region_boxes float32 [B, R, 4] normalised, region_mask int64 [B, R]; for regions with pixels
        (:class:`~vlbert.processing.images.ImageRegions`) images float32 [B, 3, H, W] and image_sizes int64 [B, 2] in
        place of region_features; on ``device`` (None: the CPU)."""
        return _to(pad_regions(self.region_items(regions)), device)

    def batch(self, texts: Sequence[str], regions: Sequence[Regions], device=None) -> dict[str, torch.Tensor]:
        """One (text, image) pair per row: :meth:`text_batch` and :meth:`region_batch` together (no layout)."""
        return {**self.text_batch(texts, device), **self.region_batch(regions, device)}

    def collator(self, target_keys: Sequence[str] = (), images_per_text: int = 1) -> GroundedCollator:
        """The training collator of this processor's items (:class:`~vlbert.processing.collator.GroundedCollator`),
        told the task's ``target_keys``: what :meth:`__call__` pads with, so that a batch is the same in training
        and inference, the unpadded layout included."""
        return GroundedCollator(self.tokenizer, target_keys, images_per_text)

    def __call__(
        self,
        text: str | Sequence[str] | None = None,
        images: ImageInput | Sequence[ImageInput] | None = None,
        regions: Regions | Sequence[Regions] | None = None,
        boxes: Sequence[np.ndarray | None] | None = None,
        device=None,
    ) -> dict[str, torch.Tensor]:
        """The model's batch of one (text, image) pair per row, as the training collator gives it.

        Args:
            text: one text or a list (one per row).
            images: one image or a list (:data:`ImageInput`), whose regions are extracted with the detector
                (:meth:`regions`); or ``regions``: the images' :class:`Regions` (checked against the record).
            boxes: per image, given pixel boxes to pool instead of detecting (see :meth:`regions`).
            device: where the tensors go (None: the CPU).
        Returns:
            text only: input_ids, token_type_ids, attention_mask int64 [B, T]; with images or regions also
            region_features float16 [B, R, D] (or images / image_sizes for a visual backbone), region_boxes
            float32 [B, R, 4], region_mask int64 [B, R] and the unpadded layout of [text ; regions]
            (:class:`~vlbert.processing.collator.GroundedCollator`'s).
        Raises:
            ValueError: nothing given, both ``images`` and ``regions``, different numbers of texts and images,
                images for a text-only processor; errors of :meth:`regions`.
        """
        if images is not None and regions is not None:
            raise ValueError("pass images (extracted with the processor's detector) or their regions, not both")
        given = images if images is not None else regions
        if text is None and given is None:
            raise ValueError("pass text=..., images=... or regions=...")
        texts = [text] if isinstance(text, str) else None if text is None else list(text)
        if given is None:
            return self.text_batch(texts, device)
        if not self.uses_regions:
            raise ValueError(
                f"this processor is text-only ({self.task or 'a text model'}): its model reads no images; pass text only"
            )
        if texts is None:
            raise ValueError("a vision-language batch needs a text per image: pass text=... too")
        single = isinstance(given, (str, os.PathLike, Regions, np.ndarray)) or hasattr(given, "mode")
        found = self.regions([given] if single else list(given), boxes)
        if len(found) == 1 and len(texts) > 1:
            found = found * len(texts)
        if len(found) != len(texts):
            raise ValueError(f"{len(texts)} texts and {len(found)} images: pass one image per text, or one for all")
        items = [
            {"input_ids": ids, **item, "index": k}
            for k, (ids, item) in enumerate(zip(self.text_ids(texts), self.region_items(found), strict=True))
        ]
        batch = self.collator()(items)
        del batch["index"]
        return _to(batch, device)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()})"


def _to(batch: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    return batch if device is None else {k: v.to(device) for k, v in batch.items()}


__all__ = [
    "VLProcessor",
    "ImageInput",
    "DEFAULT_MAX_REGIONS",
    "DEFAULT_MAX_TEXT_LENGTH",
]
