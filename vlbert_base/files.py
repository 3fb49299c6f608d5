"""Positional reads of read-only files, fork-safe: the region store and the prepared text corpora read through it."""

from __future__ import annotations

import os


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
                try:
                    os.close(fd)
                except OSError:
                    pass


__all__ = ["PositionalFiles"]
