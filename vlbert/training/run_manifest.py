"""A run's record of the files it wrote in its directory (``run_files.json``): each entry's name and content
fingerprint, so that ``--overwrite`` replaces exactly the run's own files and refuses a file the run did not write,
or one changed since it wrote it, even under a run file's name (a user's own ``predictions.json``).

A file's fingerprint is its size and the SHA-256 of its bytes; of a file over :data:`WHOLLY_HASHED_BYTES` (the final
weights), its size and the SHA-256 of its first and last MiB: reading a few GiB of weights at every checkpoint would
cost more than it guards (a user's file of the same name, the same size and the same first and last MiB is no case
to plan for). A file the run appends to as it goes (:data:`GROWING_FILES`, its ``log.jsonl``) is its own while it
still starts with the bytes recorded: an interrupted run logs past its last record. A folder the run made (its
``checkpoints``, ``tensorboard``) is recorded as a whole, its content unread: a run's checkpoints are large and change
with every save.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from vlbert.common.files import write_text_atomically
from vlbert.common.fingerprints import ends_sha256, file_sha256

#: The record's file, in the run directory.
MANIFEST_FILE = "run_files.json"
#: Files up to this size are fingerprinted by the SHA-256 of all their bytes; larger ones by their first and last MiB.
WHOLLY_HASHED_BYTES = 64 * 2**20
#: Files a run appends to while it runs: still the run's while they begin with the recorded bytes.
GROWING_FILES = ("log.jsonl",)
_END = 2**20


def entry_fingerprint(path: str | Path) -> dict[str, Any]:
    """The record of the directory entry ``path``: ``{"directory": true}`` for a folder; for a file ``{"size"
    (bytes), "sha256"}`` (all its bytes, or its first ``size`` bytes for a growing file), or ``{"size",
    "sha256_ends"}`` over :data:`WHOLLY_HASHED_BYTES` (see the module docstring).

    Raises:
        OSError: ``path`` cannot be read.
    """
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        return {"directory": True}
    size = path.stat().st_size
    if size > WHOLLY_HASHED_BYTES and path.name not in GROWING_FILES:
        return {"size": size, "sha256_ends": ends_sha256(path, size, _END)}
    return {"size": size, "sha256": file_sha256(path)}


def entry_change(path: str | Path, recorded: dict[str, Any]) -> str | None:
    """How the entry ``path`` differs from its ``recorded`` fingerprint (:func:`entry_fingerprint`), in words
    ("changed since the run wrote it (12 -> 40 bytes)"); None: still the run's (a growing file that begins with the
    recorded bytes included)."""
    path = Path(path)
    if recorded.get("directory"):
        return None if path.is_dir() else "is no longer the folder the run made"
    if path.is_dir():
        return "is a folder where the run wrote a file"
    size, was = path.stat().st_size, recorded.get("size")
    if path.name in GROWING_FILES and isinstance(was, int) and size >= was:
        return None if file_sha256(path, was) == recorded.get("sha256") else "changed since the run wrote it"
    if size != was:
        return f"changed since the run wrote it ({was} -> {size} bytes)"
    return None if entry_fingerprint(path) == recorded else "changed since the run wrote it (its bytes differ)"


def write_manifest(directory: str | Path, names: Iterable[str]) -> Path:
    """Record the entries ``names`` of ``directory`` (those that exist) as the run's, in ``run_files.json``,
    written atomically (a reader sees the previous record or the whole new one). Returns its path.

    Raises:
        OSError: an entry cannot be read, or the record cannot be written.
    """
    directory = Path(directory)
    entries = {name: entry_fingerprint(directory / name) for name in sorted(set(names)) if (directory / name).exists()}
    text = json.dumps({"format_version": 1, "files": entries}, indent=1) + "\n"
    return write_text_atomically(directory / MANIFEST_FILE, text)


def read_manifest(directory: str | Path) -> dict[str, dict[str, Any]] | None:
    """The entries ``run_files.json`` of ``directory`` records (name -> fingerprint), or None where it has none (no
    run, or a run written before the record existed).

    Raises:
        ValueError: the record is damaged (not JSON, or not the record's shape); the message names it and the fix.
    """
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
        if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
            raise TypeError
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ValueError(
            f"{path} (the run's record of the files it wrote) is damaged, so which files are the run's is unknown: "
            "choose another --output-dir (or delete the run yourself)"
        ) from None
    return files


__all__ = [
    "MANIFEST_FILE",
    "WHOLLY_HASHED_BYTES",
    "GROWING_FILES",
    "entry_fingerprint",
    "entry_change",
    "write_manifest",
    "read_manifest",
]
