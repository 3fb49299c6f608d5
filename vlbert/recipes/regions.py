"""The regions a VL task reads: the shards its data config names, or the embedded easy-VQA images extracted
with the run's ``detector`` section (cached)."""

from __future__ import annotations

from detectors.regions import Regions
from detectors.shards import load_regions, shard_paths


def task_regions(ctx, image_ids: list[str] | None = None) -> dict[str, Regions]:
    """image id -> regions for ``ctx.data`` (fields ``dataset``, ``shards``, ``cache_dir``).

    Args:
        ctx: the :class:`~vlbert.recipes.runner.RunContext` (its ``detector`` extracts easy-VQA on first use).
        image_ids: for easy-VQA without ``shards``: extract only these images (default all).
    Raises:
        ValueError: a dataset other than easy-VQA without ``data.shards``.
        FileNotFoundError: ``data.shards`` holds no shard.
    """
    data = ctx.data
    if data.shards:
        return load_regions(shard_paths(data.shards))
    if data.dataset != "easy-vqa":
        raise ValueError(f"data.dataset={data.dataset!r} needs data.shards: a directory of region shards "
                         "(tools/extract_regions.py writes them from images or imports BUTD TSV / npz features)")
    from vlbert.data.easy_vqa import easy_vqa_shards

    return load_regions(easy_vqa_shards(ctx.detector, data.cache_dir, image_ids))


__all__ = ["task_regions"]
