"""Bottom-up attention's choice of regions from a detector's proposals (Anderson et al. 2018, section 3.1 and the
authors' ``generate_tsv.py``): per-class NMS over the proposals, each proposal's best surviving class score as its
confidence, every proposal at or above a threshold, at least ``min_boxes`` and at most ``max_boxes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from vlbert.detectors.images import boxes_to_pixels
from vlbert.detectors.regions import Regions


def per_class_nms_confidence(
    boxes: torch.Tensor, class_probs: torch.Tensor, iou_threshold: float = 0.3
) -> torch.Tensor:
    """Each proposal's highest class probability among the classes for which it survives NMS.

    For every class, greedy NMS runs over all proposals ordered by that class's probability (a proposal is dropped
    when its IoU with a kept, higher-scoring one exceeds ``iou_threshold``, as ``torchvision.ops.nms``); the
    proposal's confidence is the maximum probability over the classes that kept it (0 if none did). All classes
    are processed at once: the proposals (and so their IoUs) are the same for every class.

    Args:
        boxes: float [R, 4] proposals, (x1, y1, x2, y2) in any one unit.
        class_probs: float [R, C] object-class probabilities (background column removed).
        iou_threshold: BUTD's 0.3.
    Returns:
        float [R] confidences.
    """
    from torchvision.ops import box_iou

    r, c = class_probs.shape
    if r == 0:
        return class_probs.new_zeros(0)
    overlaps = box_iou(boxes.float(), boxes.float()) > iou_threshold  # [R, R]
    order = class_probs.argsort(dim=0, descending=True, stable=True)  # [R, C] proposal at each rank, per class
    classes = torch.arange(c, device=boxes.device)
    suppressed = torch.zeros(c, r, dtype=torch.bool, device=boxes.device)
    kept = torch.zeros(c, r, dtype=torch.bool, device=boxes.device)
    for rank in range(r):
        proposal = order[rank]  # [C]
        alive = ~suppressed[classes, proposal]
        kept[classes, proposal] = alive
        suppressed |= alive[:, None] & overlaps[proposal]
    return torch.where(kept.T, class_probs, torch.zeros_like(class_probs)).max(dim=1).values


def select_regions(
    confidence: torch.Tensor, threshold: float = 0.2, min_boxes: int = 10, max_boxes: int = 100
) -> torch.Tensor:
    """Indices of the kept proposals, highest confidence first: all with ``confidence >= threshold``, topped up to
    ``min_boxes`` or cut to ``max_boxes`` by confidence (fewer only when there are fewer proposals).

    Args:
        confidence: float [R] from :func:`per_class_nms_confidence`.
    Returns:
        int64 [K] indices into the proposals.
    """
    passing = int((confidence >= threshold).sum())
    count = min(max(passing, min_boxes), max_boxes, confidence.numel())
    return confidence.argsort(descending=True, stable=True)[:count]


def check_box_selection(min_boxes: int, max_boxes: int, score_threshold: float, nms_iou: float | None = None) -> None:
    """Raise ``ValueError`` naming the field (``detector.options.*``) where BUTD's box selection settings are out of
    range: at least 1 box, ``min_boxes`` <= ``max_boxes``, a confidence threshold in [0, 1], and where the backend
    has one (not None) a per-class NMS IoU in (0, 1]."""
    for name, value in (("min_boxes", min_boxes), ("max_boxes", max_boxes)):
        if value < 1:
            raise ValueError(f"detector.options.{name} must be >= 1, got {value}")
    if min_boxes > max_boxes:
        raise ValueError(f"detector.options.min_boxes={min_boxes} exceeds max_boxes={max_boxes}")
    if not 0.0 <= score_threshold <= 1.0:
        raise ValueError(f"detector.options.score_threshold must be in [0, 1], got {score_threshold}")
    if nms_iou is not None and not 0.0 < nms_iou <= 1.0:
        raise ValueError(f"detector.options.nms_iou must be in (0, 1], got {nms_iou}")


@dataclass(frozen=True)
class BoxSelection:
    """BUTD's box selection settings: at least ``min_boxes`` and at most ``max_boxes`` proposals, those with a
    confidence >= ``score_threshold`` after per-class NMS at ``nms_iou`` (BUTD: 10, 100, 0.2, 0.3)."""

    min_boxes: int = 10
    max_boxes: int = 100
    score_threshold: float = 0.2
    nms_iou: float = 0.3


def butd_regions(
    image_id: str,
    size: tuple[int, int],
    resized_size: tuple[int, int],
    boxes: torch.Tensor,
    class_probs: torch.Tensor,
    features: torch.Tensor,
    name: str,
    selection: BoxSelection,
    attribute_head: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> Regions:
    """One image's :class:`~vlbert.detectors.regions.Regions` from its proposals, as ``generate_tsv.py`` makes them:
    :func:`per_class_nms_confidence`, :func:`select_regions`, the kept proposals' own boxes and features (no box
    regression), the class distribution renormalised over the object classes, and the attribute head's
    distribution on the kept boxes (its "no attribute" column left out, not renormalised).

    Args:
        size, resized_size: (height, width) of the image and of the resized image the boxes are in.
        boxes: float [R, 4] proposals in the resized image's pixels (x1, y1, x2, y2).
        class_probs: float [R, C] softmax over the object classes with the background column removed.
        features: float [R, D] the proposals' pooled features.
        name: the extractor's name, written into the record.
        attribute_head: ``(features [K, D], class ids int64 [K]) -> logits [K, A + 1]``, or None.
    Raises:
        RuntimeError: no proposal at all (the weights are not a detector's).
    """
    confidence = per_class_nms_confidence(boxes, class_probs, selection.nms_iou)
    keep = select_regions(confidence, selection.score_threshold, selection.min_boxes, selection.max_boxes)
    if len(keep) == 0:
        raise RuntimeError(f"image {image_id!r}: the RPN proposed no box; check the weights")
    kept = class_probs[keep]
    objects = kept / kept.sum(-1, keepdim=True).clamp_min(1e-12)
    attribute_probs = None
    if attribute_head is not None:
        attribute_probs = attribute_head(features[keep], kept.argmax(-1)).softmax(-1)[:, :-1].float().cpu().numpy()
    h, w = size
    return Regions(
        image_id,
        h,
        w,
        boxes_to_pixels(boxes[keep], resized_size, size).cpu().numpy(),
        features[keep].float().cpu().numpy(),
        confidence[keep].cpu().numpy(),
        objects.float().cpu().numpy(),
        name,
        attribute_probs=attribute_probs,
    )


__all__ = ["per_class_nms_confidence", "select_regions", "check_box_selection", "BoxSelection", "butd_regions"]
