"""The regions a VL task reads: the shards its data config names, or the embedded easy-VQA images extracted
with the run's ``detector`` section (cached); either way a :class:`detectors.store.RegionStore`, which reads each
image's regions from disk when asked (memory does not grow with the number of images)."""

from __future__ import annotations

from dataclasses import asdict

from detectors.shards import read_detector_info
from detectors.store import RegionStore
from vlbert.data.easy_vqa import easy_vqa_shards


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


__all__ = ["task_regions", "region_store", "regions_provenance", "task_provenance"]
