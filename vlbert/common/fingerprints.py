"""SHA-256 digests of a file's bytes, whole or sampled: how a run recognises the files it wrote
(:mod:`vlbert.training.run_manifest`) and the data it trained on (:mod:`vlbert.recipes.run_data`)."""

from __future__ import annotations

import hashlib
import os

#: Bytes read at a time while hashing a whole file.
_BLOCK = 2**20


def file_sha256(path: str | os.PathLike, limit: int | None = None) -> str:
    """Hex SHA-256 of the bytes of ``path``, or of its first ``limit`` bytes (all of them when it is shorter), read
    in 1 MiB blocks.

    Raises:
        OSError: ``path`` cannot be read.
    """
    digest, left = hashlib.sha256(), limit if limit is not None else float("inf")
    with open(path, "rb") as f:
        while left > 0:
            block = f.read(int(min(_BLOCK, left)))
            if not block:
                break
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def ends_sha256(path: str | os.PathLike, size: int, span: int) -> str:
    """Hex SHA-256 of the first ``span`` bytes of ``path`` followed by its last ``span`` (of all its bytes when
    ``size``, its length, is at most 2 x ``span``): a cheap fingerprint of a large file, blind to a change in its
    middle that keeps its size.

    Raises:
        OSError: ``path`` cannot be read.
    """
    with open(path, "rb") as f:
        if size <= 2 * span:
            return hashlib.sha256(f.read()).hexdigest()
        head = f.read(span)
        f.seek(size - span)
        return hashlib.sha256(head + f.read(span)).hexdigest()


__all__ = ["file_sha256", "ends_sha256"]
