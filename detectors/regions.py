"""The one record every detector backend and reader produces: an image's regions.

Units: boxes are in **pixels**, (x1, y1, x2, y2) with x to the right and y down, inside the image
(0 <= x1 <= x2 <= width, 0 <= y1 <= y2 <= height). :meth:`Regions.normalised_boxes` divides by width/height for the
model, whose ``region_boxes`` are in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class RegionError(ValueError):
    """Regions that break the schema (shape, dtype, box geometry, non-finite values); the message names the
    image and the problem."""


@dataclass
class Regions:
    """Regions of one image.

    Attributes:
        image_id: unique id of the image (str).
        height, width: image size in pixels (int > 0).
        boxes: float32 [R, 4], pixels, (x1, y1, x2, y2).
        features: float16 [R, D], one RoI feature per box.
        scores: float32 [R], detector confidence (1.0 for given boxes such as the whole image).
        class_probs: float16 [R, C] or None, the detector's class distribution per box (rows sum to 1).
        detector: name and settings of what produced them (str, e.g. ``"timm:efficientnet_lite0+felzenszwalb"``).
        attribute_probs: float16 [R, A] or None, the attribute head's distribution per box (BUTD's Visual Genome
            model: 400 attributes) without its "no attribute" column, so rows sum to at most 1.
    """

    image_id: str
    height: int
    width: int
    boxes: np.ndarray
    features: np.ndarray
    scores: np.ndarray
    class_probs: np.ndarray | None = None
    detector: str = ""
    attribute_probs: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.image_id = str(self.image_id)
        self.boxes = np.asarray(self.boxes, dtype=np.float32)
        self.features = np.asarray(self.features, dtype=np.float16)
        self.scores = np.asarray(self.scores, dtype=np.float32)
        if self.class_probs is not None:
            self.class_probs = np.asarray(self.class_probs, dtype=np.float16)
        if self.attribute_probs is not None:
            self.attribute_probs = np.asarray(self.attribute_probs, dtype=np.float16)
        self.validate()

    @property
    def num_regions(self) -> int:
        return int(self.boxes.shape[0])

    @property
    def feature_dim(self) -> int:
        return int(self.features.shape[1])

    def validate(self, box_tolerance: float = 1.0) -> None:
        """Check the schema; raise :class:`RegionError` naming the image and the fix.

        Args:
            box_tolerance: pixels a box may extend past the image edge (detectors round coordinates).
        """
        where = f"image {self.image_id!r}"
        if not (
            isinstance(self.height, (int, np.integer))
            and isinstance(self.width, (int, np.integer))
            and self.height > 0
            and self.width > 0
        ):
            raise RegionError(f"{where}: image height/width must be positive integers, got {self.height}x{self.width}")
        if self.boxes.ndim != 2 or self.boxes.shape[1] != 4:
            raise RegionError(f"{where}: boxes must be [R, 4] (x1, y1, x2, y2), got shape {self.boxes.shape}")
        r = self.boxes.shape[0]
        if r == 0:
            raise RegionError(
                f"{where}: zero regions; add at least the whole-image box [0, 0, {self.width}, {self.height}]"
            )
        if self.features.ndim != 2 or self.features.shape[0] != r:
            raise RegionError(f"{where}: features must be [R={r}, D], got shape {self.features.shape}")
        if self.scores.shape != (r,):
            raise RegionError(f"{where}: scores must be [R={r}], got shape {self.scores.shape}")
        if self.class_probs is not None and (self.class_probs.ndim != 2 or self.class_probs.shape[0] != r):
            raise RegionError(f"{where}: class_probs must be [R={r}, C], got shape {self.class_probs.shape}")
        if self.attribute_probs is not None and (self.attribute_probs.ndim != 2 or self.attribute_probs.shape[0] != r):
            raise RegionError(f"{where}: attribute_probs must be [R={r}, A], got shape {self.attribute_probs.shape}")
        for name, array in (
            ("boxes", self.boxes),
            ("features", self.features),
            ("scores", self.scores),
            ("class_probs", self.class_probs),
            ("attribute_probs", self.attribute_probs),
        ):
            if array is not None and not np.isfinite(array).all():
                bad = np.argwhere(~np.isfinite(array))[0].tolist()
                raise RegionError(
                    f"{where}: {name} hold NaN or inf (first at index {bad}); re-extract the image or drop it"
                )
        x1, y1, x2, y2 = self.boxes.T
        if (x2 < x1).any() or (y2 < y1).any():
            i = int(np.argmax((x2 < x1) | (y2 < y1)))
            raise RegionError(
                f"{where}: box {i} = {self.boxes[i].tolist()} has x2 < x1 or y2 < y1; boxes are "
                "(x1, y1, x2, y2) in pixels, not (x, y, w, h)"
            )
        t = box_tolerance
        outside = (x1 < -t) | (y1 < -t) | (x2 > self.width + t) | (y2 > self.height + t)
        if outside.any():
            i = int(np.argmax(outside))
            raise RegionError(
                f"{where}: box {i} = {self.boxes[i].tolist()} lies outside the "
                f"{self.width}x{self.height} image; boxes must be in pixels of this image"
            )

    def normalised_boxes(self) -> np.ndarray:
        """float32 [R, 4] boxes divided by (width, height, width, height), clipped to [0, 1]."""
        scale = np.array([self.width, self.height, self.width, self.height], dtype=np.float32)
        return np.clip(self.boxes / scale, 0.0, 1.0)


def whole_image_box(width: int, height: int) -> np.ndarray:
    """float32 [1, 4]: the box covering the whole image, in pixels."""
    return np.array([[0.0, 0.0, float(width), float(height)]], dtype=np.float32)


__all__ = ["Regions", "RegionError", "whole_image_box"]
