"""What the region tasks (VQA, retrieval, NLVR2, visual entailment, referring expressions) share on the data side:
one data config (:class:`RegionTaskDataConfig`, extended per task), one data class (:class:`RegionTaskData`:
examples -> regions -> the run's processor -> datasets -> the processor's collator -> feature size), a table of dataset builders per task (LAVIS's
dataset builders, as plain typed entries: :class:`DatasetBuilder`, :func:`load_examples`), and the regions they
read: the shards the config names, or the embedded easy-VQA images extracted with the run's ``detector`` section
(cached); either way a :class:`vlbert.detectors.store.RegionStore`, which reads each image's regions from disk when asked
(memory does not grow with the number of images)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Any, Callable, ClassVar

from vlbert.common.typed_config import Range
from vlbert.data.easy_vqa import easy_vqa_shards, image_paths
from vlbert.data.grounded_text import GroundedTextDataset
from vlbert.detectors.store import MergedRegions, RegionStore
from vlbert.evaluation.classification import kept_labels
from vlbert.processing import RegionSource, VLProcessor
from vlbert.processing.images import (
    ImageReader,
    image_files,
)
from vlbert.recipes.run_processor import build_run_processor, run_visual_backbone, task_preprocessing
from vlbert.recipes.runner import TaskData, write_output_file

#: The field types the region tasks' data configs share (the typed reading: :mod:`vlbert.common.typed_config`).
#: wordpieces per text, [CLS] and [SEP] included
TextLength = Annotated[int, Range(ge=3)]
#: a number of examples or images, 0 = all
Count = Annotated[int, Range(ge=0)]
#: a number that must be at least one
Positive = Annotated[int, Range(ge=1)]
#: pixels; 0 = the preprocessing's own, -1 = not resized / no limit
ImageSide = Annotated[int, Range(ge=-1)]


@dataclass
class RegionTaskDataConfig:
    """The data fields of every region task (YAML section ``data``); each task's config extends it.

    dataset: a name in the task's table of :class:`DatasetBuilder` s: "easy-vqa" (the embedded demonstration,
    its regions extracted with the run's ``detector`` section and cached under ``cache_dir``) or the public
    benchmark's files (their regions in ``shards``, a directory written by vlbert extract).
    image_id_format: how the dataset's image ids become the shards' ids ("" = the dataset's default, e.g.
    ``"COCO_train2014_{image_id:012d}"`` for LXMERT's features). max_text_length: wordpieces per text with
    [CLS]/[SEP]. max_regions: regions kept per image. max_train_examples / max_eval_examples: only the first N
    examples of each split (0 = all).

    Images, read only when the model has a ``visual_backbone`` (:func:`task_images`): image_dir (the directory of
    the images whose regions the shards hold, each ``<image id>`` or ``<image id>.jpg/.png``; easy-VQA: the
    package's own images), image_preprocessing (a name in :data:`vlbert.processing.images.PREPROCESSING`; "" = the
    backbone kind's: "vl-bert" for caffe-resnet, else "imagenet"), image_short_side / image_max_side (0 = the
    entry's; -1 = not resized / no limit).
    """

    dataset: str = "easy-vqa"
    cache_dir: str = "~/.cache/vlbert/regions"
    shards: str = ""
    image_id_format: str = ""
    max_text_length: TextLength = 40
    max_regions: Positive = 16
    max_train_examples: Count = 0
    max_eval_examples: Count = 0
    image_dir: str = ""
    image_preprocessing: str = ""
    image_short_side: ImageSide = 0
    image_max_side: ImageSide = 0


@dataclass(frozen=True)
class DatasetBuilder:
    """One dataset of a region task: how its examples are read and what that needs.

    Attributes:
        load: ``(data config, seed) -> the task's examples`` (what its data class unpacks, e.g. (train, eval)).
        needs: data fields that must be set (the public files and ``shards``).
        image_id_format: the dataset's default for ``data.image_id_format``.
    """

    load: Callable[[Any, int], Any]
    needs: tuple[str, ...] = ()
    image_id_format: str = "{image_id}"


def load_examples(datasets: dict[str, DatasetBuilder], data, seed: int):
    """``datasets[data.dataset].load(data, seed)``, after checking the name and the fields it needs; an unset
    ``data.image_id_format`` becomes the dataset's default (in place, so the run's config records it).

    Raises:
        ValueError: an unknown dataset (the known ones named) or a missing field (named, with the dataset).
    """
    builder = datasets.get(data.dataset)
    if builder is None:
        raise ValueError(f"data.dataset must be one of {', '.join(repr(k) for k in datasets)}, got {data.dataset!r}")
    missing = [f"data.{name}" for name in builder.needs if not getattr(data, name)]
    if missing:
        raise ValueError(
            f"dataset {data.dataset} needs {', '.join(missing)}; set them in the config's data "
            "section or with --set (regions: vlbert extract writes shards)"
        )
    data.image_id_format = data.image_id_format or builder.image_id_format
    return builder.load(data, seed)


def region_store(
    shards: str, dataset: str, cache_dir: str, detector, image_ids: list[str] | None = None
) -> RegionStore | MergedRegions:
    """The region store of ``shards``, or for easy-VQA without shards the images extracted with ``detector``
    (a :class:`vlbert.detectors.config.DetectorConfig`; cached under ``cache_dir``, each split apart:
    :func:`~vlbert.data.easy_vqa.easy_vqa_shards`; only ``image_ids`` when given): one split's
    :class:`~vlbert.detectors.store.RegionStore`, or both splits' as one :class:`~vlbert.detectors.store.MergedRegions`.

    Raises:
        ValueError: a dataset other than easy-VQA without shards.
        FileNotFoundError: ``shards`` holds no shard.
    """
    if shards:
        return RegionStore(shards)
    if dataset != "easy-vqa":
        raise ValueError(
            f"data.dataset={dataset!r} needs data.shards: a directory of region shards "
            "(vlbert extract writes them from images or imports BUTD TSV / npz features)"
        )

    directories = dict.fromkeys(path.parent for path in easy_vqa_shards(detector, cache_dir, image_ids))
    stores = {d.name: RegionStore(d) for d in directories}  # one cache per split (train's, test's)
    return next(iter(stores.values())) if len(stores) == 1 else MergedRegions(stores)


def task_region_source(ctx, store) -> RegionSource:
    """The :class:`~vlbert.processing.RegionSource` of a store built by :func:`task_regions` (the ``detector``
    section extracted the regions unless ``data.shards`` names them)."""
    return RegionSource.from_store(store, None if ctx.data.shards else ctx.detector)


def task_regions(ctx, image_ids: list[str] | None = None) -> RegionStore:
    """:func:`region_store` of ``ctx.data`` (fields ``dataset``, ``shards``, ``cache_dir``) and ``ctx.detector``."""
    data = ctx.data
    return region_store(data.shards, data.dataset, data.cache_dir, ctx.detector, image_ids)


def task_images(data, backbone: dict, image_ids, trained=None) -> ImageReader:
    """The image reader of a run whose model has a visual ``backbone`` (its config section): the files of
    ``image_ids`` (easy-VQA without ``data.image_dir``: the package's images; else :func:`image_files` under
    ``data.image_dir``), preprocessed by :func:`task_preprocessing` (``trained``: ``init_from``'s recorded
    preprocessing, or None).

    Raises:
        ValueError: no ``data.image_dir`` for a dataset other than easy-VQA, or easy-VQA images the package lacks
            (a task's own composites); an unknown preprocessing name.
        FileNotFoundError: an image without a file (from :func:`image_files`).
    """
    preprocessing = task_preprocessing(data, backbone, trained)
    if data.image_dir:
        return ImageReader(image_files(image_ids, data.image_dir), preprocessing)
    if data.dataset != "easy-vqa":
        raise ValueError(
            f"model.visual_backbone computes the region features from the images, but data.image_dir "
            f"is not set for data.dataset={data.dataset!r}; set it to the directory of the images whose "
            "regions the shards hold"
        )
    files = {**image_paths("train"), **image_paths("test")}
    others = [i for i in dict.fromkeys(image_ids) if i not in files]
    if others:
        raise ValueError(
            f"{len(others)} images of this task are not the easy-VQA package's (e.g. {others[0]!r}: the "
            "task composes its own), so model.visual_backbone has no pixels for them; set data.image_dir "
            "to a directory holding them"
        )
    return ImageReader({i: files[i] for i in dict.fromkeys(image_ids)}, preprocessing)


def attach_images(ctx, datasets, image_ids: Callable[[Any], list[str]], processor: VLProcessor) -> ImageReader | None:
    """For a run whose model has a visual backbone (:func:`run_visual_backbone`): the reader of every image the
    ``datasets`` name (``image_ids(dataset)``; None entries skipped) through the run ``processor``'s image
    preprocessing, set as each dataset's ``image_reader`` so that its items carry their pixels. None (nothing
    changed) for a model without one.

    Raises:
        ValueError, FileNotFoundError: from :func:`task_images`.
    """
    backbone = run_visual_backbone(ctx)
    if not backbone:
        return None
    datasets = [d for d in datasets if d is not None]
    ids = [i for d in datasets for i in image_ids(d)]
    reader = task_images(ctx.data, backbone, ids, processor.image_preprocessing)
    for d in datasets:
        d.image_reader = reader
    return reader


class RegionTaskData(TaskData):
    """A region task's data, built in one order: the examples (the task's :attr:`datasets` table, cut to
    ``data.max_train_examples`` / ``max_eval_examples``), the regions (:meth:`load_regions`), the run's
    :class:`~vlbert.processing.VLProcessor` (:func:`~vlbert.recipes.run_processor.build_run_processor` of the regions' source,
    :meth:`region_source`), the training and evaluation datasets (:meth:`dataset`, with the processor's tokenizer
    and limits), the processor's collator (:meth:`~vlbert.processing.VLProcessor.collator`, a
    :class:`~vlbert.processing.collator.GroundedCollator` told the task's :attr:`target_keys`: the batches
    ``processor(...)`` makes at inference), and the region feature size.

    A task sets :attr:`datasets`, :attr:`dataset_class` (a :class:`~vlbert.data.grounded_text.GroundedTextDataset`)
    and :attr:`target_keys`; it overrides :meth:`load_regions` (and :meth:`region_source`) where a dataset brings
    its own images, and :meth:`dataset` where its dataset class takes more than the common arguments.

    Attributes (after ``__init__``): ``train``, ``eval``, ``regions`` (image id -> Regions), ``processor``,
    ``tokenizer`` (the processor's), ``collator``, ``feature_dim`` (the backbone's for a model with a
    ``visual_backbone``), ``images`` (None, or for such a model the :class:`~vlbert.processing.images.ImageReader` whose
    pixels every item carries: :func:`attach_images`), ``extra`` (what the dataset builder returned after the train
    and eval examples).
    Raises:
        ValueError: from :func:`load_examples` (unknown dataset, missing files) and the dataset class (an image
            without regions).
    """

    datasets: ClassVar[dict[str, DatasetBuilder]] = {}
    dataset_class: ClassVar[type] = GroundedTextDataset
    target_keys: ClassVar[tuple[str, ...]] = ("labels",)
    #: where :func:`evaluate` writes the evaluation split's predictions (:meth:`predictions_text`).
    predictions_file: ClassVar[str] = "predictions.jsonl"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.data = ctx.data
        train, held_out, *self.extra = load_examples(self.datasets, ctx.data, self.seed)
        self.regions = self.load_regions(ctx)
        self.processor = build_run_processor(ctx, self, self.region_source(ctx))
        self.tokenizer = self.processor.tokenizer
        self.train = self.dataset(train[: ctx.data.max_train_examples or None], training=True)
        self.eval = self.dataset(held_out[: ctx.data.max_eval_examples or None], training=False)
        self.collator = self.processor.collator(self.target_keys, self.dataset_class.images_per_text)
        # a model with a visual backbone computes the region features from the images under the shards' boxes
        self.images = attach_images(
            ctx, (self.train, self.eval), lambda d: [i for ex in d.examples for i in d.images(ex)], self.processor
        )
        self.feature_dim = self.processor.region_source.feature_dim

    def load_regions(self, ctx):
        """Image id -> Regions of every image the examples name: :func:`task_regions` (shards or easy-VQA)."""
        return task_regions(ctx)

    def region_source(self, ctx) -> RegionSource:
        """What made :attr:`regions` (:func:`task_region_source`: the shards' detector.json, else the run's
        ``detector`` section where it extracted them)."""
        return task_region_source(ctx, self.regions)

    def dataset(self, examples: list, training: bool):
        """:attr:`dataset_class` over ``examples`` with the run's regions and processor."""
        return self.dataset_class(examples, self.regions, self.processor)

    def predict(self, model) -> tuple[list[dict], dict[str, float]]:
        """(one row per evaluation example: its benchmark id and the prediction, the task's metrics): every task's
        evaluation, in one shape."""
        raise NotImplementedError

    def predictions_text(self, rows: list[dict]) -> str:
        """The predictions file's text: one JSON object per row (a task with a benchmark format overrides it)."""
        return "".join(json.dumps(r) + "\n" for r in rows)

    def keep(self, batch: dict, output) -> list[tuple[int, tuple]]:
        """Each held-out example's (gold label, predicted label) (:func:`~vlbert.evaluation.classification.kept_labels`
        over :attr:`target_keys`)."""
        return kept_labels(batch, output, self.target_keys)

    def predict_labels(self, model) -> tuple[list[int], list[int], list[int]]:
        """(dataset indices, gold labels (None where the targets are not one class per item), predicted labels) of
        every evaluation example, gathered from every process in dataset order: from the trainer's final held-out
        pass at the end of a run, else from a pass of ``model`` (:meth:`~vlbert.recipes.runner.TaskData.predictions`)."""
        kept = self.predictions(model)
        return list(kept), [g for g, _ in kept.values()], [p for _, p in kept.values()]


def evaluate(ctx, data: RegionTaskData, model) -> dict:
    """A region task's final evaluation (a :class:`~vlbert.recipes.runner.Recipe`'s ``evaluate``): the metrics of
    ``data.predict(model)``, its rows written to ``data.predictions_file``."""
    rows, metrics = data.predict(model)
    write_output_file(ctx, data.predictions_file, data.predictions_text(rows))
    return metrics


def majority_baseline(ctx, data: RegionTaskData, model) -> dict:
    """Evaluation accuracy of always answering the most frequent training label (examples with a ``label``)."""
    majority = Counter(ex.label for ex in data.train.examples).most_common(1)[0][0]
    return {"accuracy_majority_baseline": sum(ex.label == majority for ex in data.eval.examples) / len(data.eval)}


__all__ = [
    "RegionTaskDataConfig",
    "RegionTaskData",
    "task_images",
    "attach_images",
    "evaluate",
    "majority_baseline",
    "DatasetBuilder",
    "load_examples",
    "task_regions",
    "region_store",
    "task_region_source",
]
