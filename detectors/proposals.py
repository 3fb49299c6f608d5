"""Class-agnostic box proposals that need no trained weights: Felzenszwalb-Huttenlocher graph segmentation.

Choice: the segments of Felzenszwalb & Huttenlocher (2004) at several scales are the starting point of selective
search (Uijlings et al. 2013), the proposal method of R-CNN before learned RPNs. Their bounding boxes, de-duplicated
with non-maximum suppression and completed by the whole-image box, give object-like regions on simple images
(easy-vqa's single shape) and part/object regions on photos, offline and deterministically. With a trained detector
available, use the torchvision or detectron2 backends instead.
"""

from __future__ import annotations

import numpy as np
import torch
from vlbert.detectors.regions import whole_image_box

DEFAULT_SCALES = (100.0, 500.0)


def felzenszwalb_proposals(
    image: np.ndarray,
    scales: tuple[float, ...] = DEFAULT_SCALES,
    sigma: float = 0.8,
    min_area_fraction: float = 0.01,
    min_side_fraction: float = 0.08,
    max_proposals: int = 36,
    iou_threshold: float = 0.7,
) -> np.ndarray:
    """Boxes around image segments at several scales, plus the whole image.

    Args:
        image: uint8 [H, W, 3] RGB.
        scales: Felzenszwalb ``scale`` values (larger = larger segments).
        sigma: Gaussian smoothing before segmentation.
        min_area_fraction: drop boxes smaller than this fraction of the image.
        min_side_fraction: drop slivers: boxes whose width or height is below this fraction of the image's
            (anti-aliased edges form thin segments along shapes).
        max_proposals: at most this many boxes, the whole-image box included.
        iou_threshold: NMS threshold between boxes (larger boxes win).
    Returns:
        float32 [R, 4] boxes in pixels, (x1, y1, x2, y2), whole-image box first; 1 <= R <= max_proposals.
    Raises:
        ValueError: not an [H, W, 3] image.
    """
    from skimage.segmentation import felzenszwalb
    from torchvision.ops import nms

    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected an RGB image [H, W, 3], got shape {image.shape}")
    h, w = image.shape[:2]
    boxes = []
    for scale in scales:
        labels = felzenszwalb(image, scale=scale, sigma=sigma, min_size=max(4, int(0.002 * h * w)))
        for label in np.unique(labels):
            ys, xs = np.nonzero(labels == label)
            boxes.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
    whole = whole_image_box(w, h)
    if not boxes:
        return whole
    boxes = np.asarray(boxes, dtype=np.float32)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    bw, bh = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    keep = (
        (area >= min_area_fraction * h * w)
        & (area < 0.95 * h * w)
        & (bw >= min_side_fraction * w)
        & (bh >= min_side_fraction * h)
    )
    boxes, area = boxes[keep], area[keep]
    if len(boxes):
        order = nms(torch.from_numpy(boxes), torch.from_numpy(area), iou_threshold).numpy()
        boxes = boxes[order][: max_proposals - 1]
    return np.concatenate([whole, boxes.reshape(-1, 4)], axis=0)


__all__ = ["felzenszwalb_proposals", "DEFAULT_SCALES"]
