"""Bottom-up attention's choice of regions from a detector's proposals (Anderson et al. 2018, section 3.1 and the
authors' ``generate_tsv.py``): per-class NMS over the proposals, each proposal's best surviving class score as its
confidence, every proposal at or above a threshold, at least ``min_boxes`` and at most ``max_boxes``.
"""

from __future__ import annotations

import torch


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


def check_box_selection(min_boxes: int, max_boxes: int, score_threshold: float) -> None:
    """Raise ``ValueError`` naming the field (``detector.options.*``) where BUTD's box selection settings are out of
    range: at least 1 box, ``min_boxes`` <= ``max_boxes``, a confidence threshold in [0, 1]."""
    for name, value in (("min_boxes", min_boxes), ("max_boxes", max_boxes)):
        if value < 1:
            raise ValueError(f"detector.options.{name} must be >= 1, got {value}")
    if min_boxes > max_boxes:
        raise ValueError(f"detector.options.min_boxes={min_boxes} exceeds max_boxes={max_boxes}")
    if not 0.0 <= score_threshold <= 1.0:
        raise ValueError(f"detector.options.score_threshold must be in [0, 1], got {score_threshold}")


__all__ = ["per_class_nms_confidence", "select_regions", "check_box_selection"]
