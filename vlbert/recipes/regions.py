"""What the region tasks (VQA, retrieval, NLVR2, visual entailment, referring expressions) share on the data side:
one data config (:class:`RegionTaskDataConfig`, extended per task), a table of dataset builders per task (LAVIS's
dataset builders, as plain typed entries: :class:`DatasetBuilder`, :func:`load_examples`), and the regions they
read: the shards the config names, or the embedded easy-VQA images extracted with the run's ``detector`` section
(cached); either way a :class:`detectors.store.RegionStore`, which reads each image's regions from disk when asked
(memory does not grow with the number of images)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

from detectors.shards import read_detector_info
from detectors.store import RegionStore
from vlbert.data.easy_vqa import easy_vqa_shards


@dataclass
class RegionTaskDataConfig:
    """The data fields of every region task (YAML section ``data``); each task's config extends it.

    dataset: a name in the task's table of :class:`DatasetBuilder` s: "easy-vqa" (the embedded demonstration,
    its regions extracted with the run's ``detector`` section and cached under ``cache_dir``) or the public
    benchmark's files (their regions in ``shards``, a directory written by tools/extract_regions.py).
    image_id_format: how the dataset's image ids become the shards' ids ("" = the dataset's default, e.g.
    ``"COCO_train2014_{image_id:012d}"`` for LXMERT's features). max_text_length: wordpieces per text with
    [CLS]/[SEP]. max_regions: regions kept per image.
    """

    dataset: str = "easy-vqa"
    cache_dir: str = "~/.cache/vlbert/regions"
    shards: str = ""
    image_id_format: str = ""
    max_text_length: int = 40
    max_regions: int = 16


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
        raise ValueError(f"dataset {data.dataset} needs {', '.join(missing)}; set them in the config's data "
                         "section or with --set (regions: tools/extract_regions.py writes shards)")
    data.image_id_format = data.image_id_format or builder.image_id_format
    return builder.load(data, seed)


def region_store(shards: str, dataset: str, cache_dir: str, detector, image_ids: list[str] | None = None) -> RegionStore:
    """The region store of ``shards``, or for easy-VQA without shards the images extracted with ``detector``
    (a :class:`detectors.config.DetectorConfig`; cached under ``cache_dir``; only ``image_ids`` when given).

    Raises:
        ValueError: a dataset other than easy-VQA without shards.
        FileNotFoundError: ``shards`` holds no shard.
    """
    if shards:
        return RegionStore(shards)
    if dataset != "easy-vqa":
        raise ValueError(f"data.dataset={dataset!r} needs data.shards: a directory of region shards "
                         "(tools/extract_regions.py writes them from images or imports BUTD TSV / npz features)")

    return RegionStore(easy_vqa_shards(detector, cache_dir, image_ids)[0].parent)


def task_provenance(ctx, store) -> dict:
    """:func:`regions_provenance` of a store built by :func:`task_regions` (the ``detector`` section extracted
    the regions unless ``data.shards`` names them)."""
    return regions_provenance(store, None if ctx.data.shards else ctx.detector)


def task_regions(ctx, image_ids: list[str] | None = None) -> RegionStore:
    """:func:`region_store` of ``ctx.data`` (fields ``dataset``, ``shards``, ``cache_dir``) and ``ctx.detector``."""
    data = ctx.data
    return region_store(data.shards, data.dataset, data.cache_dir, ctx.detector, image_ids)


def region_task_info(ctx, data, **extra) -> dict:
    """What a region task's run saves for inference (``inference.json``, :mod:`vlbert.inference`): the maximum
    lengths, the region feature size (``data.feature_dim``), the regions' detector (:func:`task_provenance` of
    ``data.regions``) and the task's ``extra`` fields (label names, ...; an ``extra`` key replaces a common one)."""
    return {"max_text_length": ctx.data.max_text_length, "max_regions": ctx.data.max_regions,
            "region_feature_dim": data.feature_dim, "detector": task_provenance(ctx, data.regions), **extra}


def regions_provenance(store, detector=None) -> dict:
    """What made the regions of ``store`` (a :class:`~detectors.store.RegionStore`, or a mapping of them by
    name), as saved with a run for inference (``inference.json``, :mod:`vlbert.inference`):

    ``{"fingerprint": 10 hex digits or None, "config": the DetectorConfig fields or None, "extractor": the
    extractor's name as its regions carry it}``. The shard directory's ``detector.json`` decides when it has one
    (``tools/extract_regions.py`` writes it); else ``detector`` (pass the run's ``detector`` section where it
    extracted the regions: the cached easy-VQA images); imported features (BUTD TSV, npz) have neither:
    fingerprint and config are None.
    """
    stores = list(store.stores.values()) if hasattr(store, "stores") else [store]
    info = read_detector_info(stores[0].directory) if hasattr(stores[0], "directory") else None
    first = next(iter(stores[0].values()), None)
    extractor = first.detector if first is not None else ""
    if info and info.get("fingerprint"):
        return {"fingerprint": info["fingerprint"], "config": info.get("config"), "extractor": extractor}
    if detector is not None:
        return {"fingerprint": detector.fingerprint(), "config": asdict(detector), "extractor": extractor}
    return {"fingerprint": None, "config": None, "extractor": extractor}


__all__ = ["RegionTaskDataConfig", "DatasetBuilder", "load_examples", "task_regions", "region_store",
           "region_task_info", "regions_provenance", "task_provenance"]
