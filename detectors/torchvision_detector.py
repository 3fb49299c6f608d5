"""Faster R-CNN (Ren et al. 2015) from torchvision as a bottom-up-attention style region detector.

BUTD (Anderson et al. 2018, section 3.1) keeps every box whose class confidence passes a threshold, at least 10
and at most 100 per image, and uses the box head's pooled feature as the region feature. Here: torchvision's
``fasterrcnn_resnet50_fpn`` (COCO, 91 classes); the feature is the 1024-d output of its two-layer box head
(``roi_heads.box_head``) on the final boxes; the class distribution is the softmax of its box predictor over the 90 object classes (background left out).
Weights come from torchvision's weights API when online, or from a local state-dict file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from vlbert.detectors.images import boxes_to_pixels, run_in_shape_groups, to_rgb_array
from vlbert.detectors.regions import Regions
from vlbert.detectors.selection import check_box_selection


@dataclass
class TorchvisionOptions:
    """The ``torchvision`` backend's options (``detector.options``): BUTD's box selection (each field's ``help``
    is its ``vlbert extract`` flag's text).

    Raises:
        ValueError: from :meth:`validate`, naming the field.
    """

    min_boxes: int = field(default=10, metadata={"help": "BUTD's minimum boxes per image"})
    max_boxes: int = field(default=100, metadata={"help": "BUTD's maximum boxes per image"})
    score_threshold: float = field(default=0.2, metadata={"help": "BUTD's class confidence threshold"})

    def validate(self, weights: str) -> None:
        """Raise ``ValueError`` for a box selection out of range (``weights`` "" = torchvision's COCO weights)."""
        check_box_selection(self.min_boxes, self.max_boxes, self.score_threshold)


class TorchvisionRegionDetector:
    """Image -> :class:`~vlbert.detectors.regions.Regions` with a torchvision Faster R-CNN.

    Args:
        weights: ``"DEFAULT"`` (torchvision's COCO weights, downloaded on first use), a path to a state dict
            saved from ``fasterrcnn_resnet50_fpn``, or None for random weights (tests only).
        min_boxes, max_boxes: BUTD's 10 and 100.
        score_threshold: BUTD's confidence threshold (0.2).
        device: where the model runs.
    Raises:
        FileNotFoundError: ``weights`` is a path that does not exist.
        RuntimeError: the weights cannot be downloaded (offline): the message names the local-file option.
    """

    def __init__(
        self,
        weights: str | os.PathLike | None = "DEFAULT",
        min_boxes: int = 10,
        max_boxes: int = 100,
        score_threshold: float = 0.2,
        device: str | torch.device = "cpu",
    ):
        from torchvision.models.detection import (
            FasterRCNN_ResNet50_FPN_Weights,
            fasterrcnn_resnet50_fpn,
        )

        if weights == "DEFAULT":
            try:
                model = fasterrcnn_resnet50_fpn(weights=FasterRCNN_ResNet50_FPN_Weights.DEFAULT)
            except Exception as e:
                raise RuntimeError(
                    f"could not fetch torchvision's Faster R-CNN weights ({type(e).__name__}: {e}); offline, pass "
                    "weights=<path to a fasterrcnn_resnet50_fpn state dict>, or use the timm backbone detector"
                ) from e
        else:
            model = fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None)
            if weights is not None:
                if not os.path.isfile(weights):
                    raise FileNotFoundError(f"Faster R-CNN weights file {weights} does not exist")
                model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        # Keep every candidate: BUTD's own selection (threshold, 10..100 boxes) happens in __call__.
        model.roi_heads.score_thresh = 0.0
        model.roi_heads.detections_per_img = max_boxes
        self.model = model.to(device).eval()
        self.min_boxes, self.max_boxes, self.score_threshold = min_boxes, max_boxes, score_threshold
        self.device = torch.device(device)
        self.name = f"torchvision:fasterrcnn_resnet50_fpn(weights={weights},thr={score_threshold})"

    @property
    def feature_dim(self) -> int:
        return int(self.model.roi_heads.box_head.fc7.out_features)

    @property
    def num_classes(self) -> int:
        """Object classes in ``class_probs`` (the predictor's classes less background)."""
        return int(self.model.roi_heads.box_predictor.cls_score.out_features) - 1

    def __call__(self, image, image_id: str) -> Regions:
        """Detect, keep BUTD's 10..100 boxes by score, and pool features and class distributions for them."""
        return self.extract_batch([image], [image_id])[0]

    @torch.no_grad()
    def extract_batch(self, images: list, image_ids: list[str], batch_size: int | None = None) -> list[Regions]:
        """:meth:`__call__` for several images (PIL or uint8 arrays). Only images of equal resized size share a
        forward pass (at most ``batch_size``, default all): torchvision pads a batch to its largest image, which
        changes convolutions near the border; grouped, the result equals one image at a time. Input order."""
        from torchvision.models.detection.image_list import ImageList

        m = self.model
        arrays = [to_rgb_array(im) for im in images]
        resized = []
        for a in arrays:
            # A copy as uint8 on the device (a quarter of float32's transfer; read-only arrays, e.g. np.asarray of
            # a PIL image, are fine), then float there.
            x = torch.tensor(a, device=self.device).permute(2, 0, 1).float().div(255)
            one, _ = m.transform([x])
            resized.append(one)

        def run(group: list[int]) -> list[Regions]:
            batch = ImageList(
                torch.cat([resized[i].tensors for i in group]), [resized[i].image_sizes[0] for i in group]
            )
            return self._forward(batch, [arrays[i].shape[:2] for i in group], [image_ids[i] for i in group])

        return run_in_shape_groups([tuple(r.image_sizes[0]) for r in resized], batch_size, run)

    def _forward(self, images, sizes, image_ids) -> list[Regions]:
        m = self.model
        features = m.backbone(images.tensors)
        proposals, _ = m.rpn(images, features)
        detections, _ = m.roi_heads(features, proposals, images.image_sizes)
        kept = []
        for det, (rh, rw) in zip(detections, images.image_sizes, strict=True):
            boxes, scores = det["boxes"], det["scores"]
            order = scores.argsort(descending=True)
            n = int((scores >= self.score_threshold).sum().clamp(self.min_boxes, self.max_boxes))
            boxes = boxes[order][:n]
            if len(boxes) == 0:  # nothing detected: fall back on the whole image
                boxes = torch.tensor([[0.0, 0.0, rw, rh]], device=self.device)
            kept.append(boxes)
        pooled = m.roi_heads.box_roi_pool(features, kept, images.image_sizes)
        region_features = m.roi_heads.box_head(pooled)
        class_logits, _ = m.roi_heads.box_predictor(region_features)
        # The class distribution without the background class (index 0): MRC's target is an object class
        # (UNITER leaves background out); the remaining columns are renormalised to sum to 1.
        probs = class_logits[:, 1:].softmax(-1)
        top = class_logits.softmax(-1)[:, 1:].max(-1).values
        out, start = [], 0
        for boxes, size, resized_size, image_id in zip(kept, sizes, images.image_sizes, image_ids, strict=True):
            n = len(boxes)
            pixel_boxes = boxes_to_pixels(boxes, resized_size, size)  # back to the original image's pixels
            h, w = size
            out.append(
                Regions(
                    image_id,
                    h,
                    w,
                    pixel_boxes.cpu().numpy(),
                    region_features[start : start + n].cpu().numpy(),
                    top[start : start + n].cpu().numpy(),
                    probs[start : start + n].cpu().numpy(),
                    detector=self.name,
                )
            )
            start += n
        return out


def build_torchvision_detector(
    options: TorchvisionOptions, weights: str, device: str = "cpu"
) -> TorchvisionRegionDetector:
    """The ``torchvision`` backend's build (its line of :data:`vlbert.detectors.backends.DETECTOR_BACKENDS`): Faster R-CNN
    R50-FPN with ``weights`` ("" = torchvision's COCO weights, downloaded when online) and BUTD's selection.

    Raises:
        FileNotFoundError, RuntimeError: from :class:`TorchvisionRegionDetector`.
    """
    return TorchvisionRegionDetector(
        weights=weights or "DEFAULT",
        min_boxes=options.min_boxes,
        max_boxes=options.max_boxes,
        score_threshold=options.score_threshold,
        device=device,
    )


def write_random_torchvision_weights(options: TorchvisionOptions, path: str | os.PathLike) -> None:
    """Write seeded random weights (seed 0) of ``fasterrcnn_resnet50_fpn`` to ``path``: for benchmarks only."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.save(TorchvisionRegionDetector(weights=None).model.state_dict(), path)


__all__ = [
    "TorchvisionRegionDetector",
    "TorchvisionOptions",
    "build_torchvision_detector",
    "write_random_torchvision_weights",
]
