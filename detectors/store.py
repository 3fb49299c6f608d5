"""A region store: random access by image id into a directory of region shards, in constant memory.

The shards stay on disk. A small index (image id -> shard, and each field's byte offset and size inside the
uncompressed tar) is built once by reading the tar headers and each sample's ``meta.json``, and cached beside the
shards as ``index.npz`` (rebuilt when the shard set changes: names, sizes, modification times). A lookup reads
just that image's fields with ``os.pread`` and decodes and validates them as :func:`vlbert.detectors.shards.read_shards`
does, so memory does not grow with the number of images. Worker processes (fork) and ranks open their own file
handles on first use; nothing is copied between them but the index (a few numpy arrays, about 60 bytes per image).
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Iterator

import numpy as np
from vlbert.detectors.regions import Regions
from vlbert.detectors.shards import ShardError, check_tar_complete, decode_sample, shard_paths

from vlbert.common.files import PositionalFiles

FIELDS = ("meta.json", "boxes.npy", "features.npy", "scores.npy", "class_probs.npy", "attribute_probs.npy")
INDEX = "index.npz"
INDEX_VERSION = 2
_INDEX_ARRAYS = ("ids", "shard", "offset", "size", "num_regions")


def _shard_set_key(paths: list[Path]) -> str:
    stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in paths]
    return hashlib.sha1(json.dumps([INDEX_VERSION, stats]).encode()).hexdigest()


def build_index(paths: list[Path]) -> dict[str, np.ndarray]:
    """Index arrays of the shards: ``ids`` (str, sorted), ``shard`` (int32), ``offset`` and ``size`` (int64
    [N, len(FIELDS)], -1 where a sample lacks an optional field), ``num_regions`` (int32, from meta.json).

    Raises:
        ShardError: a truncated or corrupt shard, a sample without required fields, an image id twice.
    """
    ids, shard, offsets, sizes, counts = [], [], [], [], []
    for number, path in enumerate(paths):
        check_tar_complete(path)
        with tarfile.open(path, "r:") as tar, open(path, "rb") as f:
            samples: dict[str, dict[str, tarfile.TarInfo]] = {}
            for member in tar.getmembers():
                if member.isfile():
                    key, _, field = member.name.partition(".")
                    samples.setdefault(key, {})[field] = member
            for key, members in samples.items():
                if "meta.json" not in members:
                    raise ShardError(f"{path}: sample {key!r} lacks meta.json")
                meta_info = members["meta.json"]
                f.seek(meta_info.offset_data)
                try:
                    meta = json.loads(f.read(meta_info.size))
                    image_id, count = str(meta["image_id"]), int(meta["num_regions"])
                except (json.JSONDecodeError, KeyError, UnicodeDecodeError, TypeError, ValueError) as e:
                    raise ShardError(f"{path}: sample {key!r} has an unreadable meta.json ({e})") from e
                ids.append(image_id)
                counts.append(count)
                shard.append(number)
                offsets.append([members[n].offset_data if n in members else -1 for n in FIELDS])
                sizes.append([members[n].size if n in members else -1 for n in FIELDS])
    ids_array = np.array(ids, dtype=str)
    order = np.argsort(ids_array, kind="stable")
    ids_array = ids_array[order]
    if len(ids_array) > 1 and (ids_array[1:] == ids_array[:-1]).any():
        dup = ids_array[1:][ids_array[1:] == ids_array[:-1]][0]
        raise ShardError(f"image id {dup!r} appears twice across the shards")
    return {
        "ids": ids_array,
        "shard": np.array(shard, dtype=np.int32)[order],
        "offset": np.array(offsets, dtype=np.int64).reshape(-1, len(FIELDS))[order],
        "size": np.array(sizes, dtype=np.int64).reshape(-1, len(FIELDS))[order],
        "num_regions": np.array(counts, dtype=np.int32)[order],
    }


class RegionStore(Mapping):
    """image id -> :class:`~vlbert.detectors.regions.Regions`, read from shards on disk per lookup (module docstring).

    A read-only ``Mapping``: ``store[image_id]``, ``image_id in store``, ``len(store)``, iteration over image ids
    (sorted). Every task that takes a dict of regions takes a store.

    Args:
        directory: a directory of ``*.tar`` region shards (:func:`vlbert.detectors.shards.shard_paths`).
        cache_index: write ``index.npz`` beside the shards (skipped where the directory is read-only).
    Raises:
        FileNotFoundError: no shard in the directory. ShardError: see :func:`build_index`; on lookup, a sample
            that fails validation (:func:`vlbert.detectors.shards.decode_sample`).
    """

    def __init__(self, directory: str | os.PathLike, cache_index: bool = True):
        self.directory = Path(directory).expanduser()
        self.paths = shard_paths(self.directory)
        key = _shard_set_key(self.paths)
        index_path = self.directory / INDEX
        index = None
        if index_path.is_file():
            with np.load(index_path, allow_pickle=False) as z:
                if str(z["key"]) == key:
                    index = {name: z[name] for name in _INDEX_ARRAYS}
        if index is None:
            index = build_index(self.paths)
            if cache_index and os.access(self.directory, os.W_OK):
                # A name of this process's own: several processes (the ranks of one run) may index the same
                # directory at once, and each replaces the file with the same content.
                tmp = self.directory / f"{INDEX}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp.npz"
                np.savez(tmp, key=np.array(key), **index)
                os.replace(tmp, index_path)
        self.ids, self.shard, self.offset, self.size = index["ids"], index["shard"], index["offset"], index["size"]
        self.region_counts = index["num_regions"]
        self._files = PositionalFiles()

    def _row(self, image_id: str) -> int:
        i = int(np.searchsorted(self.ids, image_id))
        if i >= len(self.ids) or self.ids[i] != image_id:
            return -1
        return i

    def __getitem__(self, image_id: str) -> Regions:
        row = self._row(str(image_id))
        if row < 0:
            raise KeyError(image_id)
        path = self.paths[self.shard[row]]
        fields = {
            name: self._files.read(path, offset, size)
            for name, offset, size in zip(FIELDS, self.offset[row], self.size[row], strict=True)
            if offset >= 0
        }
        return decode_sample(str(image_id), fields, str(self.paths[self.shard[row]]))

    def num_regions(self, image_id: str) -> int:
        """The image's region count, from the index (no read). Raises KeyError for an unknown id."""
        row = self._row(str(image_id))
        if row < 0:
            raise KeyError(image_id)
        return int(self.region_counts[row])

    def __contains__(self, image_id) -> bool:
        return self._row(str(image_id)) >= 0

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[str]:
        return (str(i) for i in self.ids)

    @property
    def feature_dim(self) -> int:
        """The region feature size (read from the first image)."""
        return self[str(self.ids[0])].feature_dim


class NamespacedRegions(Mapping):
    """Several region stores as one mapping under ``"<name>/<image id>"`` keys, for data mixed from several
    sources whose image ids may collide (COCO's 391895 is not Visual Genome's 391895).

    Args:
        stores: name -> mapping of image id -> Regions (a :class:`RegionStore` or a dict).
    """

    def __init__(self, stores: dict[str, Mapping]):
        self.stores = dict(stores)

    def _split(self, key: str) -> tuple[Mapping, str]:
        name, sep, image_id = str(key).partition("/")
        if not sep or name not in self.stores:
            raise KeyError(key)
        return self.stores[name], image_id

    def __getitem__(self, key: str) -> Regions:
        store, image_id = self._split(key)
        return store[image_id]

    def __contains__(self, key) -> bool:
        try:
            store, image_id = self._split(key)
        except KeyError:
            return False
        return image_id in store

    def num_regions(self, key: str) -> int:
        store, image_id = self._split(key)
        return region_count(store, image_id)

    def __len__(self) -> int:
        return sum(len(s) for s in self.stores.values())

    def __iter__(self) -> Iterator[str]:
        return (f"{name}/{i}" for name, store in self.stores.items() for i in store)


class MergedRegions(Mapping):
    """Several region stores whose image ids differ, as one mapping under their own ids (e.g. the easy-VQA
    training and test images, cached apart: :func:`vlbert.data.easy_vqa.easy_vqa_shards`). A lookup asks each
    store in turn (an index search each, no read).

    Args:
        stores: name -> mapping of image id -> Regions (a :class:`RegionStore` or a dict).
    Raises:
        ValueError: an image id held by two of the stores (checked once, on the stores' sorted ids).
    """

    def __init__(self, stores: dict[str, Mapping]):
        self.stores = dict(stores)
        seen: set[str] = set()
        for name, store in self.stores.items():
            ids = set(store)
            if seen & ids:
                raise ValueError(f"image id {sorted(seen & ids)[0]!r} is in region store {name!r} and another one")
            seen |= ids

    def _store(self, image_id) -> Mapping:
        for store in self.stores.values():
            if image_id in store:
                return store
        raise KeyError(image_id)

    def __getitem__(self, image_id: str) -> Regions:
        return self._store(image_id)[image_id]

    def __contains__(self, image_id) -> bool:
        return any(image_id in store for store in self.stores.values())

    def num_regions(self, image_id: str) -> int:
        """The image's region count (from a store's index where it has one). Raises KeyError for an unknown id."""
        return region_count(self._store(image_id), image_id)

    def __len__(self) -> int:
        return sum(len(s) for s in self.stores.values())

    def __iter__(self) -> Iterator[str]:
        return (i for store in self.stores.values() for i in store)

    @property
    def feature_dim(self) -> int:
        """The region feature size (read from the first image)."""
        return self[next(iter(self))].feature_dim


def region_count(regions: Mapping, image_id: str) -> int:
    """Regions of ``image_id`` in any mapping of regions; a store answers from its index (no read)."""
    if isinstance(regions, (RegionStore, NamespacedRegions, MergedRegions)):
        return regions.num_regions(image_id)
    return regions[image_id].num_regions


__all__ = ["RegionStore", "NamespacedRegions", "MergedRegions", "build_index", "region_count", "FIELDS"]
