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


def read_vocabulary(path: str | os.PathLike, count: int, kind: str) -> list[str]:
    """The names of a detector's vocabulary file: one a line (Visual Genome's ``objects_vocab.txt`` /
    ``attributes_vocab.txt``: synonyms after commas, the first kept; blank lines skipped), ``count`` of them.

    Raises:
        FileNotFoundError: no such file. ValueError: another count than the model's (``kind``: "class" or
            "attribute", for the message).
    """
    names = [line.split(",")[0].strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    names = [n for n in names if n]
    if len(names) != count:
        raise ValueError(f"{path} lists {len(names)} {kind} names; the model has {count}")
    return names


__all__ = ["BUTD_VG_CONFIG_FILE", "file_sha256", "read_vocabulary"]
