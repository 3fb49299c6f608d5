"""What identifies a detector's files by content: the sha256 of a weights file, and the packaged config file of
the BUTD Visual Genome model (``butd-vg``). No directory ever names features (docs/regions.md)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

#: The config file of the BUTD Visual Genome model (:mod:`vlbert.detectors.detectron2_butd`), named ``butd-vg``.
BUTD_VG_CONFIG_FILE = Path(__file__).parent / "configs" / "butd-vg-R101-C4-attr.yaml"


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file's content, 64 hex digits (read in 1 MiB blocks).

    Raises:
        FileNotFoundError: no such file.
    """
    digest = hashlib.sha256()
    with open(Path(path).expanduser(), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


__all__ = ["BUTD_VG_CONFIG_FILE", "file_sha256"]
