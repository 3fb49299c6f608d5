"""The regions a VL task reads: the shards its data config names, or the embedded easy-VQA images extracted
with the run's ``detector`` section (cached); either way a :class:`detectors.store.RegionStore`, which reads each
image's regions from disk when asked (memory does not grow with the number of images)."""

from __future__ import annotations

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


def task_regions(ctx, image_ids: list[str] | None = None) -> RegionStore:
    """:func:`region_store` of ``ctx.data`` (fields ``dataset``, ``shards``, ``cache_dir``) and ``ctx.detector``."""
    data = ctx.data
    return region_store(data.shards, data.dataset, data.cache_dir, ctx.detector, image_ids)


__all__ = ["task_regions", "region_store"]
