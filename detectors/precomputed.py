"""Readers for the common precomputed region-feature formats, into :class:`~vlbert.detectors.regions.Regions`
(and from there into shards with :func:`vlbert.detectors.shards.write_shards`).

* Bottom-up-attention TSV (Anderson et al. 2018's ``generate_tsv.py``; LXMERT's ``*_obj36.tsv`` adds object and
  attribute columns): one image per line, tab-separated; ``boxes`` and ``features`` are base64-encoded float32
  buffers of ``num_boxes`` rows (boxes in pixels, x1 y1 x2 y2).
* Per-image ``.npz`` (py-bottom-up-attention / VinVL style): ``x`` or ``features`` [R, D] (or [D, R]), ``bbox`` or
  ``boxes`` [R, 4] in pixels, ``image_h``, ``image_w``, optional ``cls_prob`` [R, C] and ``num_bbox``.
Both are read without unpickling (``np.load(allow_pickle=False)``).
"""

from __future__ import annotations

import base64
import csv
import os
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
from vlbert.detectors.regions import RegionError, Regions

BUTD_FIELDS = ["image_id", "image_w", "image_h", "num_boxes", "boxes", "features"]
LXMERT_FIELDS = [
    "img_id",
    "img_h",
    "img_w",
    "objects_id",
    "objects_conf",
    "attrs_id",
    "attrs_conf",
    "num_boxes",
    "boxes",
    "features",
]


def _decode(value: str, rows: int, dtype, where: str) -> np.ndarray:
    try:
        buffer = np.frombuffer(base64.b64decode(value), dtype=dtype)
    except (ValueError, TypeError) as e:
        raise RegionError(f"{where}: field is not valid base64 ({e})") from e
    if rows <= 0 or buffer.size % rows:
        raise RegionError(f"{where}: {buffer.size} values do not split into num_boxes={rows} rows")
    return buffer.reshape(rows, -1)


def read_butd_tsv(path: str | os.PathLike, detector: str = "butd-tsv") -> Iterator[Regions]:
    """Yield the regions of every line of a bottom-up-attention TSV file (6-column BUTD or 10-column LXMERT
    layout, recognised by the column count).

    Raises:
        FileNotFoundError: no such file.
        vlbert.detectors.regions.RegionError: a line with the wrong column count, bad base64, or regions that break the
            schema; the message names the file, line and image.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"TSV file {path} does not exist")
    csv.field_size_limit(sys.maxsize)
    with open(path, newline="", encoding="utf-8") as f:
        for line_no, row in enumerate(csv.reader(f, delimiter="\t"), start=1):
            if not row:
                continue
            if len(row) == len(LXMERT_FIELDS):
                rec = dict(zip(LXMERT_FIELDS, row, strict=True))
                image_id, h, w = rec["img_id"], rec["img_h"], rec["img_w"]
            elif len(row) == len(BUTD_FIELDS):
                rec = dict(zip(BUTD_FIELDS, row, strict=True))
                image_id, h, w = rec["image_id"], rec["image_h"], rec["image_w"]
            else:
                raise RegionError(
                    f"{path}:{line_no}: {len(row)} columns; expected {len(BUTD_FIELDS)} (BUTD: "
                    f"{BUTD_FIELDS}) or {len(LXMERT_FIELDS)} (LXMERT: {LXMERT_FIELDS})"
                )
            where = f"{path}:{line_no} (image {image_id})"
            n = int(rec["num_boxes"])
            boxes = _decode(rec["boxes"], n, np.float32, where + " boxes")
            features = _decode(rec["features"], n, np.float32, where + " features")
            scores = (
                _decode(rec["objects_conf"], n, np.float32, where + " objects_conf")[:, 0]
                if "objects_conf" in rec
                else np.ones(n, dtype=np.float32)
            )
            try:
                yield Regions(image_id, int(h), int(w), boxes, features, scores, None, detector)
            except RegionError as e:
                raise RegionError(f"{path}:{line_no}: {e}") from e


def write_butd_tsv(regions: list[Regions], path: str | os.PathLike) -> None:
    """Write regions in the 6-column BUTD TSV layout (features as float32): for fixtures and exchange."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t")
        for r in regions:
            writer.writerow(
                [
                    r.image_id,
                    r.width,
                    r.height,
                    r.num_regions,
                    base64.b64encode(r.boxes.astype(np.float32).tobytes()).decode(),
                    base64.b64encode(r.features.astype(np.float32).tobytes()).decode(),
                ]
            )


def read_npz(
    path: str | os.PathLike, image_id: str | None = None, detector: str = "npz", background_column: bool = True
) -> Regions:
    """Read one image's regions from a ``.npz`` file (see module docstring for the keys).

    ``cls_prob`` of the bottom-up-attention detectors (1601 Visual Genome classes) has the background class in
    column 0: with ``background_column`` it is dropped and the rest renormalised, so the class distribution
    (the MRC target) holds object classes only, as UNITER's does. Pass False for files without that column.

    Raises:
        FileNotFoundError: no such file. vlbert.detectors.regions.RegionError: missing keys or a schema violation.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"npz file {path} does not exist")
    with np.load(path, allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}

    def first(*names):
        for name in names:
            if name in data:
                return data[name]
        raise RegionError(f"{path}: needs one of {names}; it has {sorted(data)}")

    boxes = first("bbox", "boxes")
    features = first("x", "features")
    if features.ndim == 2 and features.shape[0] != boxes.shape[0] and features.shape[1] == boxes.shape[0]:
        features = features.T  # some extractors store [D, R]
    h, w = int(first("image_h", "height")), int(first("image_w", "width"))
    probs = data.get("cls_prob")
    scores = data.get("scores", data.get("obj_conf"))
    if scores is None:
        scores = probs[:, 1:].max(-1) if probs is not None else np.ones(len(boxes), dtype=np.float32)
    if probs is not None and background_column:
        objects = probs[:, 1:].astype(np.float32)
        probs = objects / np.maximum(objects.sum(-1, keepdims=True), 1e-12)
    return Regions(image_id or path.stem, h, w, boxes, features, scores, probs, detector)


__all__ = ["read_butd_tsv", "write_butd_tsv", "read_npz", "BUTD_FIELDS", "LXMERT_FIELDS"]
