"""Positional reads of read-only files, fork-safe: the region store and the prepared text corpora read through it;
and atomic text writes (run metadata, predictions, shard metadata)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


class PositionalFiles:
    """Read-only files read by position (``os.pread``), each opened once per process.

    Positional reads go through the page cache that processes share, without mapping anything into this process (a
    memory map's touched pages stay counted in its resident memory). A forked data-loader worker opens its own
    descriptors on first use, and a pickled copy starts without any.
    """

    def __init__(self):
        self._fds: dict[str, int] = {}
        self._pid = os.getpid()

    def read(self, path: str | os.PathLike, offset: int, size: int) -> bytes:
        """``size`` bytes of ``path`` from byte ``offset``."""
        if self._pid != os.getpid():
            self._fds, self._pid = {}, os.getpid()
        key = str(path)
        if key not in self._fds:
            self._fds[key] = os.open(key, os.O_RDONLY)
        return os.pread(self._fds[key], int(size), int(offset))

    def __getstate__(self):
        return {"_fds": {}, "_pid": os.getpid()}

    def __setstate__(self, state):
        self._fds, self._pid = {}, os.getpid()

    def __del__(self):
        if getattr(self, "_pid", None) == os.getpid():
            for fd in self._fds.values():
                with contextlib.suppress(OSError):
                    os.close(fd)


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same directory renamed over it, creating
    the directory: a reader sees the old file or the whole new one, never half of it. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


__all__ = ["PositionalFiles", "write_text_atomically"]
