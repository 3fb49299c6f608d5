"""Extraction with a cache: a set of images run through one detector configuration once, the shards kept under
a directory named for the image set and the configuration, and reused by every later run and task."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from vlbert.detectors.backends import DETECTOR_BACKENDS
from vlbert.detectors.config import DetectorConfig
from vlbert.detectors.extract import extract_regions
from vlbert.detectors.regions import Regions
from vlbert.detectors.shards import write_shards

logger = logging.getLogger(__name__)

MARKER = "complete.json"


def cached_shards(
    detector: DetectorConfig,
    images: dict[str, str | os.PathLike],
    cache_dir: str | os.PathLike,
    name: str,
    batch_size: int = 32,
    boxes: dict[str, np.ndarray] | None = None,
) -> list[Path]:
    """Region shards of ``images``, extracted on first use and cached.

    The cache directory is ``cache_dir/<name>-<detector fingerprint>-<image-set hash>`` (the fingerprint of
    :meth:`DetectorConfig.identified`: a weights file counts by its sha256). ``complete.json`` is
    written last, so an interrupted extraction is redone, never half-used; it records each shard's size, and a
    cache whose shards are missing or of another size since (cut off by a copy, a full disk) is extracted again.

    Args:
        detector: the configuration to extract with.
        images: image id -> image file (any format Pillow reads; converted to RGB).
        cache_dir: root of the cache (``~`` expanded).
        name: a readable name for the image set (e.g. ``"easy-vqa"``).
        batch_size: images per extractor call where the backend batches.
        boxes: image id -> float32 [R, 4] pixel xyxy boxes to pool instead of the detector's own (e.g. the
            ground-truth objects); backends whose table line says ``pools_given_boxes`` (timm) only. They are part
            of the cache's name.
    Returns:
        the shard paths, in order.

    An extraction logs its cost once, early (:func:`announce_cost`, :func:`cost_line`): "extracting regions of N
    images, about M minutes, once (cached in DIR)".
    Raises:
        ValueError: no images, or ``boxes`` with a backend that detects its own. Errors of
            :meth:`DetectorConfig.build` and of the extractor.
    """
    if not images:
        raise ValueError(f"no images to extract regions from for {name!r}")
    if boxes is not None and not DETECTOR_BACKENDS[detector.backend].pools_given_boxes:
        pooling = [name for name, entry in DETECTOR_BACKENDS.items() if entry.pools_given_boxes]
        raise ValueError(
            f"given boxes are pooled by the {', '.join(pooling)} backend only; detector.backend is {detector.backend!r}"
        )
    detector = detector.identified()  # a weights file is named by its content, not its path
    ids = list(images)
    key = "\n".join(ids) + (
        "" if boxes is None else "\n" + "\n".join(np.asarray(boxes[i]).tobytes().hex() for i in ids)
    )
    image_set = hashlib.sha1(key.encode()).hexdigest()[:8]
    directory = Path(cache_dir).expanduser() / f"{name}-{detector.fingerprint()}-{image_set}"
    marker = directory / MARKER
    if marker.is_file():
        record = json.loads(marker.read_text())
        shards = [directory / shard for shard in record["shards"]]
        sizes = record.get("sizes") or {}
        damaged = [p.name for p in shards if not p.is_file() or (p.name in sizes and p.stat().st_size != sizes[p.name])]
        if not damaged:
            return shards
        logger.warning(
            "the cached regions in %s are damaged (%s missing or cut off): extracting them again",
            directory,
            ", ".join(damaged),
        )
        marker.unlink()
    extractor = detector.build()
    sources = [(i, images[i]) for i in ids]
    regions = announce_cost(
        extract_regions(extractor, sources, batch_size, boxes), len(ids), directory, min(batch_size, len(ids))
    )
    shards = write_shards(regions, directory)
    tmp = directory / (MARKER + ".tmp")
    tmp.write_text(
        json.dumps(
            {
                "detector": extractor.name,
                "config": asdict(detector),
                "shards": [p.name for p in shards],
                "sizes": {p.name: p.stat().st_size for p in shards},
                "images": len(ids),
            },
            indent=2,
        )
    )
    os.replace(tmp, marker)
    return shards


def cost_line(count: int, seconds_per_image: float, directory: str | os.PathLike) -> str:
    """What an extraction will cost, said before it runs: ``"extracting regions of 1,000 images, about 2 minutes,
    once (cached in DIR)"`` for ``count`` images at ``seconds_per_image`` (wall seconds, measured), in whole minutes
    ("under a minute" below 60 s)."""
    seconds = count * seconds_per_image
    minutes = round(seconds / 60)
    cost = "under a minute" if seconds < 60 else "about a minute" if minutes == 1 else f"about {minutes} minutes"
    return f"extracting regions of {count:,} images, {cost}, once (cached in {directory})"


def announce_cost(
    regions: Iterable[Regions], count: int, directory: str | os.PathLike, batch: int
) -> Iterator[Regions]:
    """``regions`` as they come, logging :func:`cost_line` once, early: timed on the second ``batch`` of images
    (the first one carries the model's warm-up, which would inflate the estimate by a third), or on the first where
    there are no more than two batches."""
    start, mark = time.perf_counter(), batch if count > 2 * batch else 0
    for done, r in enumerate(regions, 1):
        if done == mark:
            start = time.perf_counter()
        elif done == mark + batch:
            logger.info(cost_line(count, (time.perf_counter() - start) / batch, directory))
        yield r


__all__ = ["cached_shards", "cost_line", "announce_cost"]
