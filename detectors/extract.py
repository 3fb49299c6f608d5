"""Images -> region shards at the users' size: batched, split across processes, resumable.

``torchrun --nproc_per_node N tools/extract_regions.py ...`` (or one process per machine with ``--nnodes``) sets
``RANK`` and ``WORLD_SIZE``; process r takes images r, r + N, r + 2N, ... and writes its own shards
(``regions-rank<r>-<k>.tar``) into the one output directory. Shards are written under a temporary name and renamed
when complete (:func:`detectors.shards.write_shards`), so a killed extraction leaves no half shard that reads as
complete; run the same command again and every image already in a complete shard is skipped.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from detectors.config import DetectorConfig
from detectors.images import load_image, to_rgb_array
from detectors.regions import Regions
from detectors.shards import (read_detector_info, sample_key, shard_image_keys, write_detector_info,
                              write_shards)

logger = logging.getLogger(__name__)

ImageSource = tuple[str, "str | os.PathLike | np.ndarray"]


def extract_regions(extractor, sources: Sequence[ImageSource], batch_size: int = 8,
                    boxes: dict[str, np.ndarray] | None = None, progress: bool = True) -> Iterator[Regions]:
    """Yield the regions of each (image id, file or uint8 array) in order, ``batch_size`` images per
    ``extractor.extract_batch`` call where the extractor has one.

    Args:
        extractor: a backend from :meth:`detectors.config.DetectorConfig.build`.
        boxes: image id -> float32 [R, 4] pixel boxes to pool instead of detecting (timm backend only).
    Raises:
        FileNotFoundError, detectors.images.ImageDecodeError: an image that cannot be read (the message names it).
    """
    from tqdm.auto import tqdm

    with tqdm(total=len(sources), desc="extract regions", unit="img", dynamic_ncols=True, disable=not progress) as bar:
        for start in range(0, len(sources), batch_size):
            chunk = sources[start:start + batch_size]
            ids = [image_id for image_id, _ in chunk]
            arrays = [to_rgb_array(src) if isinstance(src, np.ndarray) else load_image(src) for _, src in chunk]
            if boxes is not None:
                yield from extractor.extract_batch(arrays, ids, [boxes[i] for i in ids])
            elif hasattr(extractor, "extract_batch"):
                yield from extractor.extract_batch(arrays, ids)
            else:
                yield from (extractor(a, i) for a, i in zip(arrays, ids))
            bar.update(len(chunk))


def distributed_rank() -> tuple[int, int]:
    """(rank, world size) from torchrun's ``RANK`` / ``WORLD_SIZE`` (0, 1 when run directly).

    Raises:
        ValueError: a rank outside [0, world size).
    """
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is outside WORLD_SIZE={world}")
    return rank, world


def _same_detector(a: dict, b: dict) -> bool:
    """Whether two ``detector.json`` records name the same features (their configs where both have one, as
    :meth:`DetectorConfig.difference` compares them; else their fingerprints)."""
    if a.get("config") and b.get("config"):
        return DetectorConfig.from_record(a["config"]).difference(DetectorConfig.from_record(b["config"])) is None
    return a.get("fingerprint") == b.get("fingerprint")


def extract_to_shards(extractor, sources: Sequence[ImageSource], output_dir: str | os.PathLike, info: dict,
                      rank: int = 0, world_size: int = 1, batch_size: int = 8,
                      samples_per_shard: int = 1000) -> list[Path]:
    """Extract this process's share of ``sources`` into ``output_dir``, skipping images already in complete shards.

    Args:
        extractor: the backend.
        sources: (image id, file or array) pairs, the same list in every process.
        output_dir: the shard directory (created).
        info: what identifies the extraction (``detector.json``: extractor name, config, class names); a directory
            whose ``detector.json`` says another detector is refused, so one store never mixes two detectors.
        rank, world_size: this process and the number of processes (:func:`distributed_rank`).
        batch_size: images per forward pass (the detectron2 and torchvision backends batch only equal sizes).
        samples_per_shard: images per shard.
    Returns:
        the shards this call wrote.
    Raises:
        ValueError: duplicate image ids, or ``output_dir`` holds shards of another detector.
        detectors.shards.ShardError: a complete-looking shard is corrupt.
    """
    repeated = [i for i, n in Counter(image_id for image_id, _ in sources).items() if n > 1]
    if repeated:
        raise ValueError(f"image id {repeated[0]!r} appears twice in the images; ids are file paths without their "
                         "suffix (a.jpg and a.png collide), so rename one or extract the folders separately")
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    existing = read_detector_info(directory)
    if existing is not None and not _same_detector(existing, info):
        raise ValueError(f"{directory} holds shards of another detector ({existing.get('detector')}, config "
                         f"{existing.get('fingerprint')}); extract into a new --output-dir or delete that one")
    if existing is None and rank == 0:
        write_detector_info(directory, info)
    prefix = f"regions-rank{rank:04d}"
    for stale in directory.glob(f"{prefix}-*.tar.tmp"):
        stale.unlink()  # a half shard of an interrupted run: its images are redone below
    done: set[str] = set()
    for shard in sorted(directory.glob("*.tar")):
        done |= shard_image_keys(shard)
    share = sources[rank::world_size]
    mine = [s for s in share if sample_key(s[0]) not in done]
    skipped = len(share) - len(mine)
    if skipped:
        logger.info("rank %d: %d images already extracted, %d to go", rank, skipped, len(mine))
    numbers = [int(m.group(1)) for p in directory.glob(f"{prefix}-*.tar")
               if (m := re.fullmatch(re.escape(prefix) + r"-(\d+)\.tar", p.name))]
    if not mine:
        return []
    return write_shards(extract_regions(extractor, mine, batch_size, progress=rank == 0), directory, prefix=prefix,
                        max_samples_per_shard=samples_per_shard, start_index=max(numbers, default=-1) + 1)


__all__ = ["extract_regions", "extract_to_shards", "distributed_rank"]
