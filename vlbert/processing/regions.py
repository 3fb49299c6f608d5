"""Regions into model inputs: slicing one image's :class:`~vlbert.detectors.regions.Regions` and padding a batch of them
under the model's input names (``region_features``, ``region_boxes``, ``region_mask``). Every VL task (pretraining,
VQA, retrieval, classification) builds its region tensors here; detectors/ below knows regions, never the model's
batch. Which regions to mask is masked region modelling's decision, and the padding of its targets its own
(:mod:`vlbert.objectives.region_targets`).

Units: ``region_boxes`` are normalised to [0, 1] by image width and height, (x1, y1, x2, y2); features stay
float16 until the model casts them.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from vlbert.detectors.regions import Regions
from vlbert.processing.images import ImageReader, pad_images

logger = logging.getLogger(__name__)
#: the ``max_regions`` values whose cut was already reported in this process (one line each, not one per image).
_CUTS_REPORTED: set[int] = set()


def region_item(regions: Regions, max_regions: int) -> dict:
    """The first ``max_regions`` regions of one image as dataset-item fields.

    Args:
        regions: the image's regions (boxes in pixels).
        max_regions: keep at most this many (the detector's order: most confident first; the timm backend puts
            the whole image first).
    Returns:
        dict with ``region_features`` float16 [R, D], ``region_boxes`` float32 [R, 4] normalised xyxy and
        ``class_probs`` float16 [R, C] or None, ``attribute_probs`` float16 [R, A] or None (BUTD's attribute
        head), and for :class:`~vlbert.processing.images.ImageRegions` their ``pixels``; R = min(num_regions,
        max_regions). The first image cut for a
        ``max_regions`` value is reported with one warning line per process (the cut is never silent).
    Raises:
        ValueError: ``max_regions`` < 1.
    """
    if max_regions < 1:
        raise ValueError(f"max_regions must be >= 1, got {max_regions}")
    n = min(regions.num_regions, max_regions)
    if regions.num_regions > max_regions and max_regions not in _CUTS_REPORTED:
        _CUTS_REPORTED.add(max_regions)
        logger.warning(
            "max_regions=%d keeps the first %d of image %r's %d regions; images with more are cut the same "
            "way (said once): raise data.max_regions to keep them",
            max_regions,
            max_regions,
            regions.image_id,
            regions.num_regions,
        )
    item = {
        "region_features": regions.features[:n],
        "region_boxes": regions.normalised_boxes()[:n],
        "class_probs": regions.class_probs[:n] if regions.class_probs is not None else None,
        "attribute_probs": regions.attribute_probs[:n] if regions.attribute_probs is not None else None,
    }
    pixels = getattr(regions, "pixels", None)  # an ImageRegions (a pipeline over a visual-backbone model)
    return item if pixels is None else {**item, "pixels": pixels}


def pad_regions(items: list[dict], feature_dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """Pad per-image regions (as :func:`region_item` gives them) into a batch.

    Args:
        items: per image, ``region_features`` [R_i, D] and ``region_boxes`` [R_i, 4] (arrays or CPU tensors).
        feature_dtype: of the padded features (float16, as shards store them; float32 for features a visual
            backbone computed, :func:`vlbert.evaluation.retrieval.backbone_regions`).
    Returns:
        region_features ``feature_dtype`` [B, R, D], region_boxes float32 [B, R, 4] (normalised xyxy, zeros at padding),
        region_mask int64 [B, R] (1 = real region), R = the largest R_i. Items that carry their image's
        ``pixels`` (float [3, h, w], for a model with a visual backbone: :func:`with_pixels`) give ``images``
        float32 [B, 3, H, W] and ``image_sizes`` int64 [B, 2] (height, width) in place of ``region_features``
        (:func:`vlbert.processing.images.pad_images`); the boxes stay the shards'.
    Raises:
        ValueError: an empty list, or items whose feature sizes differ.
    """
    if not items:
        raise ValueError("cannot pad an empty list of regions")
    if "pixels" in items[0]:
        padded = pad_regions([{k: v for k, v in x.items() if k != "pixels"} for x in items])
        del padded["region_features"]
        return {**padded, **pad_images([x["pixels"] for x in items])}
    dims = {np.shape(x["region_features"])[1] for x in items}
    if len(dims) != 1:
        raise ValueError(
            f"region features of one batch must share a size, got sizes {sorted(dims)}; extract "
            "every image with the same detector"
        )
    b, r, d = len(items), max(len(x["region_features"]) for x in items), dims.pop()
    feats = torch.zeros(b, r, d, dtype=feature_dtype)
    boxes = torch.zeros(b, r, 4, dtype=torch.float32)
    mask = torch.zeros(b, r, dtype=torch.long)
    for i, x in enumerate(items):
        n = len(x["region_features"])
        feats[i, :n] = torch.as_tensor(np.asarray(x["region_features"]), dtype=feature_dtype)
        boxes[i, :n] = torch.from_numpy(np.asarray(x["region_boxes"], dtype=np.float32))
        mask[i, :n] = 1
    return {"region_features": feats, "region_boxes": boxes, "region_mask": mask}


def with_pixels(item: dict, image_id: str, images: ImageReader | None) -> dict:
    """``item`` (a :func:`region_item`) with ``pixels``, its image's preprocessed pixels float32 [3, h, w]
    (``images(image_id)``), when the run reads images (``images`` is not None: its model has a visual backbone);
    else ``item`` itself. Raises KeyError from the reader for an image without a file."""
    return item if images is None else {**item, "pixels": images(image_id)}


__all__ = ["region_item", "pad_regions", "with_pixels"]
