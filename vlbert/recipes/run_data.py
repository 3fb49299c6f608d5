"""What a run trained on, recorded in its directory (``trained_on.json``) so that ``--resume`` can refuse changed
data: the fingerprint of every data file its ``data`` section names (its size and the SHA-256 of its bytes; for a
file over :data:`HASHED_BYTES`, its size and modification time), of every data directory it names (region shards,
an image folder, a text corpus folder: :func:`directory_fingerprint`), and the task's labels in logit order (VQA's
answer vocabulary, a classifier's label names: the rows of the checkpoint's head). Rebuilt from changed annotations,
the labels can come out in another order, and the head's rows would then mean other answers.

A run written before this record existed is compared on its labels alone, read from its ``processor.json``; one
written before directories were recorded, on its files and labels.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from vlbert.common.files import write_text_atomically
from vlbert.common.fingerprints import ends_sha256, file_sha256
from vlbert.detectors.store import INDEX as REGION_INDEX
from vlbert.run_files import read_processor_record
from vlbert.utils import process_position

#: The run directory's record of its data.
DATA_RECORD_FILE = "trained_on.json"
#: Files up to this size are fingerprinted by the SHA-256 of their bytes; larger ones by size and modification time.
HASHED_BYTES = 64 * 2**20
#: Of each file in a data directory, this many bytes at its start and as many at its end are hashed.
SAMPLED_BYTES = 8 * 2**10
#: A data directory's record lists its files (and a change names the first that differs) up to this many.
LISTED_FILES = 1000
_FIX = "resume with the original files, or start a new run with --output-dir NEW"


def _file_fingerprint(path: Path) -> dict[str, Any]:
    stat = path.stat()
    if stat.st_size > HASHED_BYTES:
        return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return {"size": stat.st_size, "sha256": file_sha256(path)}


def directory_fingerprint(directory: str | Path) -> dict[str, Any]:
    """The record of a data directory: ``{"directory": true, "files": N, "bytes": total, "sha256": digest}``, and
    ``"listing": {relative path: [size, sample sha256]}`` for at most :data:`LISTED_FILES` files. The digest covers
    every file below it (hidden names and the region store's ``index.npz``, which a run may rewrite, left out), in
    sorted order: its relative path, its size, and the SHA-256 of its first and last :data:`SAMPLED_BYTES`.

    Why these: sizes and names alone miss a file rewritten at the same size (region shards re-extracted with another
    detector hold as many regions of as many bytes, and the first sample's header and features differ);
    modification times change with every copy of a data set (a resume after moving the data would be refused); and
    hashing every byte of tens of GB of shards or images at each run's start would cost minutes. The cost here is one
    ``stat`` and at most two reads of :data:`SAMPLED_BYTES` per file. A change inside a large file that keeps its size,
    its start and its end is not seen.

    Raises:
        OSError: a file cannot be read.
    """
    root = Path(directory).expanduser()
    rows = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts) or relative.as_posix() == REGION_INDEX:
            continue
        if path.is_file():
            size = path.stat().st_size
            rows.append((relative.as_posix(), size, ends_sha256(path, size, SAMPLED_BYTES)))
    digest = hashlib.sha256("".join(f"{name}\t{size}\t{sha}\n" for name, size, sha in rows).encode()).hexdigest()
    record = {"directory": True, "files": len(rows), "bytes": sum(r[1] for r in rows), "sha256": digest}
    if len(rows) <= LISTED_FILES:
        record["listing"] = {name: [size, sha] for name, size, sha in rows}
    return record


def _fingerprint(path: Path) -> dict[str, Any]:
    return directory_fingerprint(path) if path.is_dir() else _file_fingerprint(path)


def _data_files(value: Any, key: str) -> dict[str, str]:
    """``key`` -> path of every string in ``value`` (a data section, nested sections, lists) naming a file or a
    directory, caches aside (a ``*cache_dir`` field: what a run derives from its data, not the data)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: v for name, item in value.items() for k, v in _data_files(item, f"{key}.{name}").items()}
    if isinstance(value, (list, tuple)):
        return {k: v for i, item in enumerate(value) for k, v in _data_files(item, f"{key}[{i}]").items()}
    if key.endswith("cache_dir"):
        return {}
    if isinstance(value, (str, os.PathLike)) and str(value) and Path(value).expanduser().exists():
        return {key: str(value)}
    return {}


def data_fingerprint(data_config: Any, labels: list | None) -> dict[str, Any]:
    """The record of what a run trains on: ``{"files": {config key: {"path", "size", "sha256" | "mtime_ns"} or, for
    a directory, {"path", **directory_fingerprint}}, "labels": [...] | None}``.

    Args:
        data_config: the run's ``data`` section (a dataclass or mapping); every string naming an existing file or
            directory is fingerprinted, under its dotted key (``data.train_annotations``, ``data.sources[0].captions``,
            ``data.shards``), caches aside (``data.cache_dir``).
        labels: the task's labels in logit order (the run's processor's), or None.
    """
    files = {
        key: {"path": path, **_fingerprint(Path(path).expanduser())}
        for key, path in _data_files(data_config, "data").items()
    }
    return {"files": files, "labels": list(labels) if labels is not None else None}


def write_data_record(output_dir: str | Path, fingerprint: dict[str, Any]) -> None:
    """Write ``fingerprint`` (:func:`data_fingerprint`) as the run's ``trained_on.json``, atomically, by the main
    process only."""
    if process_position()[0] == 0:
        write_text_atomically(Path(output_dir) / DATA_RECORD_FILE, json.dumps(fingerprint, indent=1) + "\n")


def _recorded(output_dir: Path) -> dict[str, Any] | None:
    path = output_dir / DATA_RECORD_FILE
    if path.is_file():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            raise ValueError(
                f"--resume: {path} is damaged (not JSON); restore it, or start a new run with --output-dir NEW"
            ) from None
        if isinstance(record, dict):
            return record
    processor = read_processor_record(output_dir)  # a run written before trained_on.json: its labels alone
    return {"labels": processor.get("labels")} if processor is not None else None


def _label_change(before: list, now: list) -> str:
    """In words: how the labels ``now`` differ from ``before``."""
    if sorted(map(str, before)) == sorted(map(str, now)):
        moved = [b for b, n in zip(before, now, strict=True) if b != n]
        return f"{len(moved)} reordered: {', '.join(repr(m) for m in moved[:4])} now at other rows"
    gone, new = [x for x in before if x not in now], [x for x in now if x not in before]
    parts = [f"{len(before)} -> {len(now)} labels"]
    if gone:
        parts.append(f"gone: {', '.join(repr(x) for x in gone[:3])}{' ...' if len(gone) > 3 else ''}")
    if new:
        parts.append(f"new: {', '.join(repr(x) for x in new[:3])}{' ...' if len(new) > 3 else ''}")
    return "; ".join(parts)


def refuse_changed_data(output_dir: str | Path, fingerprint: dict[str, Any]) -> None:
    """``--resume``: refuse data other than the run's own, before anything is trained or written: a data file
    whose bytes (or, over :data:`HASHED_BYTES`, size or modification time) differ from the run's record, or labels
    in another order or another set. Nothing is refused where the run has no record (neither ``trained_on.json``
    nor ``processor.json``).

    Raises:
        ValueError: one line naming what changed (the config key and file, or the labels and how) and the fix.
    """
    output_dir = Path(output_dir)
    recorded = _recorded(output_dir)
    if recorded is None:
        return
    before, now = recorded.get("labels"), fingerprint.get("labels")
    if before is not None and now is not None and list(before) != list(now):
        source = ", ".join(f"{k} ({v['path']})" for k, v in fingerprint["files"].items() if "train" in k) or "data"
        raise ValueError(
            f"--resume: the task's labels (the answer vocabulary, the head's rows) built from {source} changed since "
            f"the run started ({_label_change(list(before), list(now))}); {_FIX}"
        )
    for key, was in (recorded.get("files") or {}).items():
        change = _file_change(was, fingerprint["files"].get(key))
        if change:
            raise ValueError(f"--resume: {key} ({was.get('path')}) {change}; {_FIX}")


def _file_change(was: dict[str, Any], now: dict[str, Any] | None) -> str | None:
    """How a data file's fingerprint ``now`` differs from the recorded one ``was``, in words; None: unchanged."""
    if now is None:
        return f"is no longer a {'directory' if was.get('directory') else 'file'} the run can read"
    if {k: v for k, v in now.items() if k != "path"} == {k: v for k, v in was.items() if k != "path"}:
        return None
    if was.get("directory") or now.get("directory"):
        return _directory_change(was, now)
    if was.get("size") != now.get("size"):
        return f"changed since the run started ({was.get('size')} -> {now['size']} bytes)"
    return (
        f"changed since the run started ({'its bytes differ' if 'sha256' in now else 'its modification time differs'})"
    )


def _directory_change(was: dict[str, Any], now: dict[str, Any]) -> str:
    """How a data directory's record ``now`` differs from the recorded ``was`` (:func:`directory_fingerprint`)."""
    if not (was.get("directory") and now.get("directory")):
        return "changed since the run started (a file where there was a directory, or the reverse)"
    before, after = was.get("listing"), now.get("listing")
    if isinstance(before, dict) and isinstance(after, dict):
        gone, new = sorted(set(before) - set(after)), sorted(set(after) - set(before))
        changed = sorted(name for name in set(before) & set(after) if before[name] != after[name])
        parts = [
            f"{len(x)} {what}: {', '.join(x[:3])}{' ...' if len(x) > 3 else ''}"
            for x, what in ((changed, "changed"), (new, "new"), (gone, "gone"))
            if x
        ]
        return f"changed since the run started ({'; '.join(parts)})"
    return (
        f"changed since the run started ({was.get('files')} -> {now.get('files')} files, "
        f"{was.get('bytes')} -> {now.get('bytes')} bytes)"
    )


__all__ = [
    "DATA_RECORD_FILE",
    "HASHED_BYTES",
    "SAMPLED_BYTES",
    "LISTED_FILES",
    "directory_fingerprint",
    "data_fingerprint",
    "write_data_record",
    "refuse_changed_data",
]
