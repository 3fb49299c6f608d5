"""Region shards: webdataset tar files, one sample per image, and the one reader for them.

Schema (version 1), per sample ``<key>.*`` where ``<key>`` is the image id with dots replaced:
    meta.json         {"schema": 1, "image_id": str, "height": int, "width": int, "detector": str, "num_regions": R,
                       and from extraction of image files (optional): "source": the file it was read from,
                       "bytes": its size, "sha256": its content's hash (the image's identity beside its id)}
    boxes.npy         float32 [R, 4]  pixels, (x1, y1, x2, y2)
    features.npy      float16 [R, D]
    scores.npy        float32 [R]
    class_probs.npy   float16 [R, C]  (optional) detector class distribution
    attribute_probs.npy float16 [R, A] (optional) attribute distribution (BUTD's attribute head)
A directory of shards may hold ``detector.json`` (:func:`write_detector_info`): the extractor, its configuration,
and the names of the classes and attributes that the columns of ``class_probs`` / ``attribute_probs`` stand for.
Fields are decoded explicitly (JSON, and ``.npy`` without pickle support): a shard from elsewhere can never run code,
and every sample is validated (:meth:`vlbert.detectors.regions.Regions.validate`) before use.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
from vlbert.detectors.regions import Regions

from vlbert.common.files import write_text_atomically

SCHEMA_VERSION = 1
REQUIRED_FIELDS = ("meta.json", "boxes.npy", "features.npy", "scores.npy")


class ShardError(ValueError):
    """A shard that cannot be read: corrupt or truncated tar, missing fields, duplicate image ids."""


#: What to do about a corrupt or truncated shard, said by every refusal of one: the command that wrote it repairs it.
DAMAGED_SHARD_FIX = (
    "run the command that wrote it again: vlbert extract with the same --images and "
    "--output-dir sets a damaged shard aside (.corrupt) and extracts only its images, an import "
    "(--from-tsv / --from-npz) rewrites every shard; for a cache under data.cache_dir, delete that "
    "directory and the next run extracts it again"
)


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


#: .npy headers already parsed -> (shape, fortran_order, dtype). numpy parses each header with ast.literal_eval,
#: which was half of a VL batch's loading time; a store repeats a few headers (one per field and region count).
_NPY_HEADERS: dict[bytes, tuple[tuple[int, ...], bool, np.dtype]] = {}


def _npy_array(data: bytes, where: str) -> np.ndarray:
    """A .npy member as an array (a writable copy); object arrays and truncated data raise :class:`ShardError`."""
    start = {1: 10, 2: 12}.get(data[6]) if len(data) >= 12 and data[:6] == b"\x93NUMPY" else None
    if start is not None:
        end = start + int.from_bytes(data[8:start], "little")
        parsed = _NPY_HEADERS.get(data[:end])
        if parsed is not None:
            shape, fortran, dtype = parsed
            count = int(np.prod(shape, dtype=np.int64))
            if len(data) - end < count * dtype.itemsize:
                raise ShardError(f"{where}: truncated .npy array ({len(data) - end} bytes for {shape} {dtype})")
            array = np.frombuffer(data, dtype=dtype, count=count, offset=end)
            return (array.reshape(shape[::-1]).T if fortran else array.reshape(shape)).copy()
    try:
        array = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    except ValueError as e:
        raise ShardError(f"{where}: not a plain .npy array ({e}); object arrays are refused") from e
    if start is not None and len(_NPY_HEADERS) < 4096:
        stream = io.BytesIO(data)
        read_header = (
            np.lib.format.read_array_header_1_0
            if np.lib.format.read_magic(stream) == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        _NPY_HEADERS[data[:end]] = read_header(stream)
    return array


def sample_key(image_id: str) -> str:
    """A webdataset key for ``image_id`` (webdataset splits names at the first dot)."""
    return str(image_id).replace(".", "_").replace("/", "_")


def write_shards(
    regions: Iterable[Regions],
    directory: str | os.PathLike,
    prefix: str = "regions",
    max_samples_per_shard: int = 1000,
    start_index: int = 0,
    provenance: Callable[[str], dict] | None = None,
) -> list[Path]:
    """Write regions to ``directory/prefix-000000.tar`` etc. (numbered from ``start_index``).

    Each shard is written under a temporary name and renamed when complete, so a crash never leaves a shard
    that looks finished. Returns the shard paths in order. ``provenance``: image id -> further ``meta.json`` fields
    (the image file's ``source``, ``bytes`` and ``sha256``: :func:`vlbert.detectors.extract.extract_to_shards`).

    Raises:
        ShardError: two regions share an image id.
    """
    import webdataset as wds

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    seen: set[str] = set()
    writer, tmp, count = None, None, 0

    def close():
        if writer is not None:
            writer.close()
            final = tmp.with_name(tmp.name[: -len(".tmp")])
            os.replace(tmp, final)
            paths.append(final)

    for r in regions:
        if r.image_id in seen:
            raise ShardError(f"image id {r.image_id!r} appears twice; image ids must be unique")
        seen.add(r.image_id)
        if writer is None or count >= max_samples_per_shard:
            close()
            tmp = directory / f"{prefix}-{start_index + len(paths):06d}.tar.tmp"
            writer, count = wds.TarWriter(str(tmp)), 0
        sample = {
            "__key__": sample_key(r.image_id),
            "meta.json": json.dumps(
                {
                    "schema": SCHEMA_VERSION,
                    "image_id": r.image_id,
                    "height": int(r.height),
                    "width": int(r.width),
                    "detector": r.detector,
                    "num_regions": r.num_regions,
                    **(provenance(r.image_id) if provenance is not None else {}),
                }
            ).encode(),
            "boxes.npy": _npy_bytes(r.boxes.astype(np.float32)),
            "features.npy": _npy_bytes(r.features.astype(np.float16)),
            "scores.npy": _npy_bytes(r.scores.astype(np.float32)),
        }
        if r.class_probs is not None:
            sample["class_probs.npy"] = _npy_bytes(r.class_probs.astype(np.float16))
        if r.attribute_probs is not None:
            sample["attribute_probs.npy"] = _npy_bytes(r.attribute_probs.astype(np.float16))
        writer.write(sample)
        count += 1
    close()
    return paths


def check_tar_complete(path: Path) -> None:
    """Raise :class:`ShardError` unless every member's data lies inside the file and the end-of-archive marker
    (two 512-byte zero blocks) follows: webdataset's streaming reader silently drops a sample cut off mid-file."""
    size = path.stat().st_size
    try:
        with tarfile.open(path, "r:") as tar:
            members = tar.getmembers()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ShardError(f"{path} is corrupt or truncated ({type(e).__name__}: {e}); {DAMAGED_SHARD_FIX}") from e
    end = max((m.offset_data + (m.size + 511) // 512 * 512 for m in members), default=0)
    with open(path, "rb") as f:
        f.seek(end)
        marker = f.read(1024)
    if end > size or marker != bytes(1024):
        raise ShardError(
            f"{path} is corrupt or truncated: it ends at byte {size} without tar's end-of-archive "
            f"marker after its last member (byte {end}); {DAMAGED_SHARD_FIX}"
        )


def _iter_tar_samples(path: Path) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Raw samples of one shard as (key, {field: bytes}), through webdataset's tar iterator (no decoding)."""
    from webdataset.tariterators import tarfile_samples

    check_tar_complete(path)
    try:
        for sample in tarfile_samples([{"url": str(path)}]):
            key = sample.pop("__key__")
            fields = {k: v for k, v in sample.items() if not k.startswith("__")}
            yield key, fields
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ShardError(f"{path} is corrupt or truncated ({type(e).__name__}: {e}); {DAMAGED_SHARD_FIX}") from e
    except ValueError as e:
        if "duplicate file name" in str(e):
            raise ShardError(
                f"{path}: a sample has the same field twice (duplicate key in the shard): {e}; rewrite the shard"
            ) from e
        raise


def decode_sample(key: str, fields: dict[str, bytes], where: str) -> Regions:
    """Turn one sample's raw fields into validated :class:`Regions` (raises ShardError / RegionError)."""
    missing = [f for f in REQUIRED_FIELDS if f not in fields]
    if missing:
        raise ShardError(f"{where}: sample {key!r} lacks {missing}; every sample needs {list(REQUIRED_FIELDS)}")
    try:
        meta = json.loads(fields["meta.json"])
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ShardError(f"{where}: sample {key!r} has invalid meta.json ({e})") from e
    if meta.get("schema") != SCHEMA_VERSION:
        raise ShardError(
            f"{where}: sample {key!r} has schema {meta.get('schema')!r}, this reader reads {SCHEMA_VERSION}"
        )
    arrays = {
        name: _npy_array(fields[name + ".npy"], f"{where}:{key}.{name}.npy")
        for name in ("boxes", "features", "scores", "class_probs", "attribute_probs")
        if name + ".npy" in fields
    }
    for name, dtype in (
        ("boxes", np.float32),
        ("features", np.float16),
        ("scores", np.float32),
        ("class_probs", np.float16),
        ("attribute_probs", np.float16),
    ):
        if name in arrays and arrays[name].dtype != dtype:
            raise ShardError(f"{where}: sample {key!r} field {name} is {arrays[name].dtype}, the schema says {dtype}")
    try:
        return Regions(
            image_id=meta["image_id"],
            height=int(meta["height"]),
            width=int(meta["width"]),
            boxes=arrays["boxes"],
            features=arrays["features"],
            scores=arrays["scores"],
            class_probs=arrays.get("class_probs"),
            detector=meta.get("detector", ""),
            attribute_probs=arrays.get("attribute_probs"),
        )
    except KeyError as e:
        raise ShardError(f"{where}: sample {key!r} meta.json lacks {e}") from e


def read_shards(paths: Iterable[str | os.PathLike]) -> Iterator[Regions]:
    """Yield the validated :class:`Regions` of every sample of every shard, in order.

    Raises:
        FileNotFoundError: a shard does not exist.
        ShardError: corrupt/truncated tar, missing or duplicate fields, wrong dtype, duplicate image id.
        vlbert.detectors.regions.RegionError: a sample breaks the schema (boxes outside the image, NaN, zero regions...).
    """
    seen: set[str] = set()
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"region shard {path} does not exist")
        for key, fields in _iter_tar_samples(path):
            regions = decode_sample(key, fields, str(path))
            if regions.image_id in seen:
                raise ShardError(f"{path}: image id {regions.image_id!r} appears twice across the shards")
            seen.add(regions.image_id)
            yield regions


def shard_paths(directory: str | os.PathLike) -> list[Path]:
    """The ``*.tar`` region shards in ``directory``, sorted.

    Raises:
        FileNotFoundError: the directory does not exist or holds no shard (the message names the tool that
            writes them).
    """
    paths = sorted(Path(directory).expanduser().glob("*.tar"))
    if not paths:
        raise FileNotFoundError(
            f"no region shards (*.tar) in {directory}; write them with "
            "vlbert extract (--images, --from-tsv or --from-npz)"
        )
    return paths


def shard_image_keys(path: str | os.PathLike) -> set[str]:
    """The sample keys (:func:`sample_key` of the image ids) in a complete shard, from the tar headers alone.

    Raises:
        ShardError: the shard is truncated or corrupt.
    """
    path = Path(path)
    check_tar_complete(path)
    with tarfile.open(path, "r:") as tar:
        return {m.name.split(".", 1)[0] for m in tar.getmembers() if m.isfile()}


def readable_image_keys(path: str | os.PathLike) -> set[str]:
    """The sample keys of a damaged shard's members that can still be read, up to where it breaks ({} for a file
    that is no tar at all): the images it is known to have held."""
    keys: set[str] = set()
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if member.isfile():
                    keys.add(member.name.split(".", 1)[0])
    except (tarfile.TarError, EOFError, OSError):
        pass
    return keys


def shard_provenance(path: str | os.PathLike, keys: set[str]) -> dict[str, dict]:
    """sample key -> the ``source`` / ``bytes`` / ``sha256`` fields of its ``meta.json``, for the samples of a
    complete shard whose key is in ``keys`` and whose meta records them (extraction of image files writes them).

    Raises:
        ShardError: the shard is truncated or corrupt, or a meta.json is not JSON.
    """
    path = Path(path)
    check_tar_complete(path)
    out: dict[str, dict] = {}
    with tarfile.open(path, "r:") as tar:
        for member in tar.getmembers():
            key, _, field = member.name.partition(".")
            if field != "meta.json" or key not in keys:
                continue
            try:
                meta = json.loads(tar.extractfile(member).read())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ShardError(f"{path}: sample {key!r} has invalid meta.json ({e}); {DAMAGED_SHARD_FIX}") from e
            if isinstance(meta, dict) and "sha256" in meta:
                out[key] = {name: meta.get(name) for name in ("image_id", "source", "bytes", "sha256")}
    return out


DETECTOR_INFO = "detector.json"


def write_detector_info(directory: str | os.PathLike, info: dict) -> Path:
    """Write ``directory/detector.json`` (the extractor, its config, class and attribute names) atomically."""
    return write_text_atomically(Path(directory) / DETECTOR_INFO, json.dumps(info, indent=1))


def read_detector_info(directory: str | os.PathLike) -> dict | None:
    """``directory/detector.json`` as a dict, or None where there is none (shards imported from features).

    Raises:
        ShardError: the file is not valid JSON.
    """
    path = Path(directory) / DETECTOR_INFO
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ShardError(f"{path} is not valid JSON ({e}); delete it and re-extract") from e


def load_regions(paths: Iterable[str | os.PathLike]) -> dict[str, Regions]:
    """All regions of the shards in memory, by image id (features stay float16)."""
    return {r.image_id: r for r in read_shards(paths)}


__all__ = [
    "write_shards",
    "read_shards",
    "load_regions",
    "shard_paths",
    "shard_image_keys",
    "readable_image_keys",
    "shard_provenance",
    "write_detector_info",
    "read_detector_info",
    "ShardError",
    "SCHEMA_VERSION",
    "sample_key",
    "DAMAGED_SHARD_FIX",
]
