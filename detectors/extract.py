"""Images -> region shards at the users' size: batched, split across processes, resumable.

``torchrun --nproc_per_node N -m vlbert extract ...`` (or one process per machine with ``--nnodes``) sets
``RANK`` and ``WORLD_SIZE``; process r takes images r, r + N, r + 2N, ... and writes its own shards
(``regions-rank<r>-<k>.tar``) into the one output directory. Shards are written under a temporary name and renamed
when complete (:func:`vlbert.detectors.shards.write_shards`), so a killed extraction leaves no half shard that reads as
complete; run the same command again and every image already in a complete shard is skipped. A shard damaged
since (cut off by a copy, a full disk) is set aside as ``<name>.corrupt`` by that rerun and its images are extracted
again. Each sample records its image file and the file's sha256 (``meta.json``), so an image id already in the store
with other content (a second folder's ``cat.jpg``) is refused, not skipped.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections import Counter
from itertools import islice
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
from vlbert.detectors.config import DetectorConfig
from vlbert.detectors.files import file_sha256
from vlbert.detectors.images import load_image, to_rgb_array
from vlbert.detectors.regions import Regions
from vlbert.detectors.shards import (
    ShardError,
    read_detector_info,
    readable_image_keys,
    sample_key,
    shard_image_keys,
    shard_provenance,
    write_detector_info,
    write_shards,
)

logger = logging.getLogger(__name__)

ImageSource = tuple[str, "str | os.PathLike | np.ndarray"]


#: :func:`extract_regions` groups equal-size images over this many batches' images before it cuts batches, so that
#: on images of mixed sizes the backends that batch only equal sizes (detectron2, torchvision) get fuller batches
#: than within one batch's images; docs/performance.md "Region extraction" gives the batch sizes that come of it.
GROUP_WINDOW_BATCHES = 8


def default_num_workers() -> int:
    """Decoding threads for one extraction process: one less than its share of the CPUs (the CPUs this process
    may run on over torchrun's ``LOCAL_WORLD_SIZE``), at most 4 and at least 0 (0: decode in the model's thread)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    per_process = cpus // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(0, min(4, per_process - 1))


def _decode(source) -> np.ndarray:
    """uint8 [H, W, 3] RGB of a file (:func:`load_image`) or an array (:func:`to_rgb_array`)."""
    return to_rgb_array(source) if isinstance(source, np.ndarray) else load_image(source)


def decoded_images(
    sources: Sequence[ImageSource], num_workers: int = 0, ahead: int = 8
) -> Iterator[tuple[str, np.ndarray]]:
    """(image id, uint8 [H, W, 3] RGB) of each source in order: files read, EXIF orientation applied and converted
    (:func:`vlbert.detectors.images.load_image`), arrays converted (:func:`to_rgb_array`).

    With workers, images are decoded by a pool of threads ahead of the caller, at most ``ahead`` (or
    ``num_workers``) images in flight: Pillow's decoders release the GIL, and threads share the caller's memory, so
    nothing is pickled and no process is forked (a process forked from one that holds multiprocessing queues, a
    test's or a launcher's, can hang at exit on the queues' threads it inherits).

    Args:
        sources: (image id, file or array) pairs.
        num_workers: threads decoding ahead of the caller; 0 = decode in this thread, one image at a time as the
            caller asks.
        ahead: with workers, how many images are decoded ahead of the caller at most.
    Raises:
        FileNotFoundError, vlbert.detectors.images.ImageDecodeError: an image that cannot be read (the message
            names it), when the caller reaches it: the images before it are yielded first.
        ValueError: ``num_workers`` < 0.
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0 (0: decode in this thread), got {num_workers}")
    if num_workers == 0 or len(sources) < 2:
        for image_id, source in sources:
            yield image_id, _decode(source)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=min(num_workers, len(sources)), thread_name_prefix="vlbert-decode")
    remaining, pending = iter(sources), deque()

    def submit_next() -> None:
        item = next(remaining, None)
        if item is not None:
            pending.append((item[0], pool.submit(_decode, item[1])))

    try:
        for _ in range(max(ahead, num_workers)):
            submit_next()
        while pending:
            image_id, future = pending.popleft()
            image = future.result()  # a decoding error is raised here, as it was raised
            submit_next()
            yield image_id, image
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # the decoding stops with the caller, also when it stops early


def extract_regions(
    extractor,
    sources: Sequence[ImageSource],
    batch_size: int = 8,
    boxes: dict[str, np.ndarray] | None = None,
    progress: bool = True,
    num_workers: int = 0,
) -> Iterator[Regions]:
    """Yield the regions of each (image id, file or uint8 array) in input order, ``batch_size`` images per
    ``extractor.extract_batch`` call where the extractor has one.

    Images are decoded ahead of the model (:func:`decoded_images`) and taken :data:`GROUP_WINDOW_BATCHES` batches at a
    time; within such a window, images of equal size are put next to each other (in order of each size's first
    image) before the window is cut into batches, so that the backends that batch only equal sizes get fuller
    batches; the regions are then yielded in input order.

    Args:
        extractor: a backend from :meth:`vlbert.detectors.config.DetectorConfig.build`.
        sources: (image id, file or array) pairs.
        batch_size: images per ``extract_batch`` call (>= 1).
        boxes: image id -> float32 [R, 4] pixel boxes to pool instead of detecting (timm backend only).
        progress: show a progress bar.
        num_workers: threads decoding the images ahead of the model (:func:`default_num_workers` is a machine's
            sensible number); 0 = in this thread, between forward passes. Pipelines that extract a few images per
            call keep 0.
    Raises:
        FileNotFoundError, vlbert.detectors.images.ImageDecodeError: an image that cannot be read (the message names it).
        ValueError: ``batch_size`` < 1 or ``num_workers`` < 0.
    """
    from tqdm.auto import tqdm

    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    window = batch_size * GROUP_WINDOW_BATCHES
    decoded = decoded_images(sources, num_workers, ahead=window)
    try:
        with tqdm(
            total=len(sources), desc="extract regions", unit="img", dynamic_ncols=True, disable=not progress
        ) as bar:
            while block := list(islice(decoded, window)):
                yield from _extract_window(extractor, block, batch_size, boxes)
                bar.update(len(block))
    finally:
        decoded.close()  # the decoding workers stop with the caller, also when it stops early


def _extract_window(
    extractor, block: list[tuple[str, np.ndarray]], batch_size: int, boxes: dict[str, np.ndarray] | None
) -> list[Regions]:
    """The regions of ``block``'s decoded images in its order, equal sizes batched together (see
    :func:`extract_regions`)."""
    first: dict[tuple[int, ...], int] = {}
    for _, array in block:
        first.setdefault(array.shape, len(first))
    order = sorted(range(len(block)), key=lambda k: first[block[k][1].shape])  # stable: input order within a size
    out: list[Regions | None] = [None] * len(block)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        ids = [block[k][0] for k in chunk]
        arrays = [block[k][1] for k in chunk]
        if boxes is not None:
            results = extractor.extract_batch(arrays, ids, [boxes[i] for i in ids])
        elif hasattr(extractor, "extract_batch"):
            results = extractor.extract_batch(arrays, ids)
        else:
            results = [extractor(a, i) for a, i in zip(arrays, ids, strict=True)]
        for k, regions in zip(chunk, results, strict=True):
            out[k] = regions
    return out


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


def source_provenance(source) -> dict:
    """What identifies an image source by content: for a file its path (``source``), size (``bytes``) and
    ``sha256``; for an array ``source`` "array" and the sha256 of its shape and bytes."""
    if isinstance(source, np.ndarray):
        digest = hashlib.sha256(repr((source.shape, source.dtype.str)).encode())
        digest.update(np.ascontiguousarray(source).tobytes())
        return {"source": "array", "bytes": int(source.nbytes), "sha256": digest.hexdigest()}
    path = Path(source)
    return {"source": str(path), "bytes": path.stat().st_size, "sha256": file_sha256(path)}


def _set_aside(shard: Path, error: ShardError, names: dict[str, str]) -> None:
    """Move a damaged shard out of the store (``<name>.corrupt``, kept, never deleted) so that its images are
    extracted again; refuse where it held images that ``names`` (sample key -> source, this command's images)
    lacks, which a rerun would not bring back.

    Raises:
        ShardError: the shard held images this command does not extract (one named, with the fix).
    """
    others = sorted(readable_image_keys(shard) - set(names))
    if others:
        raise ShardError(
            f"{error}; it also holds images this command does not extract (e.g. {others[0]!r}): run the "
            "command that extracted those, or delete the shard if they are not needed"
        ) from error
    target = shard.with_name(shard.name + ".corrupt")
    k = 1
    while target.exists():
        target, k = shard.with_name(f"{shard.name}.{k}.corrupt"), k + 1
    try:
        os.replace(shard, target)
    except FileNotFoundError:  # another process set it aside first
        return
    logger.warning("%s is damaged (%s): moved to %s; its images are extracted again", shard, error, target.name)


def _check_same_content(done: dict[str, dict], sources: dict[str, object], directory: Path) -> None:
    """Refuse an image whose id the store already holds from other content (its recorded sha256 differs):
    ``done`` = sample key -> the stored provenance, ``sources`` = sample key -> this command's source.

    Raises:
        ValueError: one line naming both files and their hashes, with the fix.
    """
    for key, stored in done.items():
        source = sources[key]
        if not isinstance(source, np.ndarray):
            path = Path(source)
            if stored.get("source") == str(path) and stored.get("bytes") == path.stat().st_size:
                continue  # the same file as extracted (a resumed run): not read again
        now = source_provenance(source)
        if now["sha256"] != stored.get("sha256"):
            raise ValueError(
                f"image id {stored.get('image_id')!r} of {now['source']} is already in {directory} from "
                f"{stored.get('source')}, a different picture (sha256 {now['sha256'][:12]} vs "
                f"{str(stored.get('sha256'))[:12]}): image ids are file paths under the --images folder without "
                "their ending, so the two collide; extract the other folder into its own --output-dir, or rename "
                "the file"
            )


def pending_sources(
    sources: Sequence[ImageSource], output_dir: str | os.PathLike, info: dict, rank: int = 0, world_size: int = 1
) -> list[ImageSource]:
    """This process's share of ``sources`` that ``output_dir`` does not hold yet, after the checks that keep a
    store one detector's and each id one picture's. Writes nothing, except that a damaged shard (cut off by a copy,
    a full disk) is set aside as ``<name>.corrupt`` (kept), so that its images are among those returned.

    Args:
        sources: (image id, file or array) pairs, the same list in every process.
        output_dir: the shard directory (need not exist).
        info: what identifies the extraction (``detector.json``'s ``config`` / ``fingerprint`` at least).
        rank, world_size: this process and the number of processes (:func:`distributed_rank`).
    Raises:
        ValueError: duplicate image ids; ``output_dir`` holds shards of another detector; an image id the store
            holds from another picture (its recorded sha256 differs from the file's; both files named).
        vlbert.detectors.shards.ShardError: a damaged shard holding images ``sources`` lacks (a rerun would lose them).
    """
    repeated = [i for i, n in Counter(image_id for image_id, _ in sources).items() if n > 1]
    if repeated:
        raise ValueError(
            f"image id {repeated[0]!r} appears twice in the images; ids are file paths without their "
            "suffix (a.jpg and a.png collide), so rename one or extract the folders separately"
        )
    directory = Path(output_dir)
    existing = read_detector_info(directory) if directory.is_dir() else None
    if existing is not None and not _same_detector(existing, info):
        raise ValueError(
            f"{directory} holds shards of another detector ({existing.get('detector')}, config "
            f"{existing.get('fingerprint')}); extract into a new --output-dir or delete that one"
        )
    by_key = {sample_key(image_id): source for image_id, source in sources}
    done: set[str] = set()
    complete = []
    for shard in sorted(directory.glob("*.tar")):
        try:
            done |= shard_image_keys(shard)
            complete.append(shard)
        except ShardError as e:
            _set_aside(shard, e, by_key)
        except FileNotFoundError:  # set aside by another process meanwhile
            continue
    stored = {}
    for shard in complete:
        stored.update(shard_provenance(shard, done & set(by_key)))
    _check_same_content(stored, by_key, directory)
    share = sources[rank::world_size]
    mine = [s for s in share if sample_key(s[0]) not in done]
    if len(share) > len(mine):
        logger.info("rank %d: %d images already extracted, %d to go", rank, len(share) - len(mine), len(mine))
    return mine


def extract_to_shards(
    extractor,
    sources: Sequence[ImageSource],
    output_dir: str | os.PathLike,
    info: dict,
    rank: int = 0,
    world_size: int = 1,
    batch_size: int = 8,
    samples_per_shard: int = 1000,
    num_workers: int | None = None,
) -> list[Path]:
    """Extract this process's share of ``sources`` into ``output_dir``, skipping images already in complete shards
    (:func:`pending_sources`: a damaged shard is set aside as ``.corrupt`` and its images extracted again). Each
    sample's ``meta.json`` records its source's :func:`source_provenance`.

    Args:
        extractor: the backend.
        sources: (image id, file or array) pairs, the same list in every process.
        output_dir: the shard directory (created).
        info: what identifies the extraction (``detector.json``: extractor name, config, class names); a directory
            whose ``detector.json`` says another detector is refused, so one store never mixes two detectors.
        rank, world_size: this process and the number of processes (:func:`distributed_rank`).
        batch_size: images per forward pass (the detectron2 and torchvision backends batch only equal sizes).
        samples_per_shard: images per shard.
        num_workers: threads decoding images ahead of the model (:func:`extract_regions`); None =
            :func:`default_num_workers`, 0 = the model's thread.
    Returns:
        the shards this call wrote.
    Raises:
        ValueError, vlbert.detectors.shards.ShardError: see :func:`pending_sources`.
        FileNotFoundError, vlbert.detectors.images.ImageDecodeError: an image that cannot be read (named).
    """
    mine = pending_sources(sources, output_dir, info, rank, world_size)
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    if read_detector_info(directory) is None and rank == 0:
        write_detector_info(directory, info)
    prefix = f"regions-rank{rank:04d}"
    for stale in directory.glob(f"{prefix}-*.tar.tmp"):
        stale.unlink()  # a half shard of an interrupted run: its images are among ``mine``
    if not mine:
        return []
    numbers = [
        int(m.group(1))
        for p in directory.glob(f"{prefix}-*.tar")
        if (m := re.fullmatch(re.escape(prefix) + r"-(\d+)\.tar", p.name))
    ]
    by_id = dict(mine)
    return write_shards(
        extract_regions(
            extractor,
            mine,
            batch_size,
            progress=rank == 0,
            num_workers=default_num_workers() if num_workers is None else num_workers,
        ),
        directory,
        prefix=prefix,
        max_samples_per_shard=samples_per_shard,
        start_index=max(numbers, default=-1) + 1,
        provenance=lambda image_id: source_provenance(by_id[image_id]),
    )


__all__ = [
    "GROUP_WINDOW_BATCHES",
    "decoded_images",
    "default_num_workers",
    "extract_regions",
    "extract_to_shards",
    "pending_sources",
    "distributed_rank",
    "source_provenance",
]
