"""One detector configuration for every place that extracts regions: the ``detector`` section of the VL run
configs, the region cache, and ``tools/extract_regions.py`` (whose flags map onto these fields).

Backends:
  * ``timm``: Felzenszwalb proposals + the whole image, RoI-aligned on an ImageNet backbone
    (:class:`detectors.backbone.BackboneRegionExtractor`; works offline with the packaged EfficientNet-Lite0);
  * ``torchvision``: Faster R-CNN R50-FPN with BUTD's box selection
    (:class:`detectors.torchvision_detector.TorchvisionRegionDetector`);
  * ``detectron2``: :class:`detectors.detectron2_detector.Detectron2RegionDetector` (needs detectron2).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

BACKENDS = ("timm", "torchvision", "detectron2")

#: The fields that change what each backend extracts (and so name its cache).
_FIELDS_BY_BACKEND = {
    "timm": ("input_size", "roi_output_size", "max_proposals", "low_level_stage", "weights"),
    "torchvision": ("weights", "min_boxes", "max_boxes", "score_threshold"),
    "detectron2": ("config_file", "weights", "min_boxes", "max_boxes", "score_threshold", "nms_iou", "overrides",
                   "class_names", "attribute_names"),
}


@dataclass
class DetectorConfig:
    """How images become regions (YAML section ``detector``; ``tools/extract_regions.py`` flags).

    Attributes:
        backend: one of :data:`BACKENDS`.
        input_size: timm: the backbone's square input in pixels (ImageNet: 224; the easy-VQA configs use 160).
        roi_output_size: timm: RoIAlign grid (cells per side) before average pooling.
        max_proposals: timm: boxes per image including the whole-image box.
        low_level_stage: timm: also pool this early backbone stage and append it (keeps colour); -1 = final only.
        weights: a weights file; "" = the backend's default (timm: the packaged ImageNet weights; torchvision:
            its COCO weights, downloaded when online).
        config_file: detectron2: the model's config file, ``butd-vg`` (the BUTD Visual Genome model with attributes,
            :mod:`detectors.butd`), or a model-zoo name such as ``COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml``.
        min_boxes, max_boxes, score_threshold: torchvision/detectron2: BUTD's box selection (10, 100, 0.2).
        nms_iou: detectron2: BUTD's per-class NMS IoU over the proposals (0.3).
        overrides: detectron2: config overrides, {"MODEL.RPN.POST_NMS_TOPK_TEST": 300, ...}.
        class_names, attribute_names: detectron2: vocabulary files (one name per line) written with the shards.
    Raises:
        ValueError: from :meth:`validate`, naming the field.
    """

    backend: str = "timm"
    input_size: int = 224
    roi_output_size: int = 3
    max_proposals: int = 36
    low_level_stage: int = 2
    weights: str = ""
    config_file: str = ""
    min_boxes: int = 10
    max_boxes: int = 100
    score_threshold: float = 0.2
    nms_iou: float = 0.3
    overrides: dict = field(default_factory=dict)
    class_names: str = ""
    attribute_names: str = ""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` for an unknown backend or sizes out of range."""
        if self.backend not in BACKENDS:
            raise ValueError(f"detector.backend must be one of {BACKENDS}, got {self.backend!r}")
        for name in ("input_size", "roi_output_size", "max_proposals", "min_boxes", "max_boxes"):
            if getattr(self, name) < 1:
                raise ValueError(f"detector.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.nms_iou <= 1.0:
            raise ValueError(f"detector.nms_iou must be in (0, 1], got {self.nms_iou}")
        if not 0.0 <= self.score_threshold <= 1.0:
            raise ValueError(f"detector.score_threshold must be in [0, 1], got {self.score_threshold}")
        if not isinstance(self.overrides, dict):
            raise ValueError(f"detector.overrides must be a mapping of detectron2 config keys to values, got "
                             f"{self.overrides!r}")
        if self.min_boxes > self.max_boxes:
            raise ValueError(f"detector.min_boxes={self.min_boxes} exceeds max_boxes={self.max_boxes}")
        if self.backend == "detectron2" and not (self.config_file and self.weights):
            raise ValueError("the detectron2 backend needs detector.config_file and detector.weights")

    def build(self, device: str = "cpu"):
        """The extractor this config describes: a callable ``(image, image_id) -> Regions`` with
        ``extract_batch(images, image_ids)`` where the backend batches.

        Raises:
            ModuleNotFoundError: the backend's package is missing (the message names the install).
            FileNotFoundError: ``weights`` names a file that does not exist.
        """
        if self.backend == "timm":
            from functools import partial

            from detectors.backbone import BackboneRegionExtractor, load_efficientnet_lite0
            from detectors.proposals import felzenszwalb_proposals

            return BackboneRegionExtractor(
                model=load_efficientnet_lite0(self.weights or None), input_size=self.input_size,
                roi_output_size=self.roi_output_size, device=device,
                proposals=partial(felzenszwalb_proposals, max_proposals=self.max_proposals),
                low_level_stage=self.low_level_stage if self.low_level_stage >= 0 else None)
        if self.backend == "torchvision":
            from detectors.torchvision_detector import TorchvisionRegionDetector

            return TorchvisionRegionDetector(weights=self.weights or "DEFAULT", min_boxes=self.min_boxes,
                                             max_boxes=self.max_boxes, score_threshold=self.score_threshold,
                                             device=device)
        from detectors.detectron2_detector import Detectron2RegionDetector

        return Detectron2RegionDetector(self.config_file, self.weights, device, min_boxes=self.min_boxes,
                                        max_boxes=self.max_boxes, score_threshold=self.score_threshold,
                                        nms_iou=self.nms_iou, overrides=self.overrides,
                                        class_names=self.class_names or None,
                                        attribute_names=self.attribute_names or None)

    def fingerprint(self) -> str:
        """10 hex digits naming what this config extracts (only the fields its backend reads)."""
        values = {"backend": self.backend}
        values.update({k: v for k, v in asdict(self).items()
                       if k in _FIELDS_BY_BACKEND[self.backend] and v not in ("", {})})
        return hashlib.sha1(json.dumps(values, sort_keys=True).encode()).hexdigest()[:10]


__all__ = ["DetectorConfig", "BACKENDS"]
