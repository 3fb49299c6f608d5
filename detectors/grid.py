"""Grid features: a backbone's feature map over the whole image, cut into grid_size x grid_size cells, each cell a
region (the ``grid`` detector backend, :data:`vlbert.detectors.backends.DETECTOR_BACKENDS`).

Jiang et al. 2020, "In Defense of Grid Features for Visual Question Answering" (CVPR 2020): the
convolutional feature map of a detector's or classifier's backbone, taken over the whole image with no proposals
and no RoI pooling, serves as the visual tokens and matches region features on VQA at a fraction of the extraction
cost. Here the final map [C, h, w] is adaptive-average-pooled to ``grid_size`` x ``grid_size`` cells (the paper
feeds every map position; pooling fixes the number of visual tokens, so a model reads as many tokens as it would
from the ``timm`` backend's regions). Cell (row r, column c) of an H x W image:

* box: its rectangle of the original image, in pixels, (x1, y1, x2, y2) = (c W / G, r H / G, (c + 1) W / G,
  (r + 1) H / G), float32; the G^2 boxes tile the image exactly (shared edges, no gap, no overlap); regions are in
  row-major order (row 0 left to right, then row 1...);
* feature: the mean of the feature-map positions the cell's rectangle overlaps (``adaptive_avg_pool2d``: rows
  floor(r h / G) .. ceil((r + 1) h / G) - 1, columns likewise), float16;
* class_probs: the backbone's classifier applied to that mean (for a timm model ``forward_head`` on it as a 1 x 1
  map: the head's global pooling is then the identity), softmaxed; None where the backbone has no classifier;
* scores: the cell's top class probability (as the ``timm`` backend scores a region), 1.0 where there is no
  classifier.

Colour: deep ImageNet features are largely invariant to colour (see :mod:`vlbert.detectors.backbone`). As the
``timm`` backend does, the cell is also average-pooled on an early feature level (``low_level_stage``, an index of
the model's ``feature_info``; level 2 of EfficientNet-Lite0: stride 8, 40 channels) and that vector is appended:
the same multi-level pooling, over cells instead of boxes, so the two backends' features differ only in where they
are pooled (EfficientNet-Lite0: 1280 + 40 = 1320-d).

What makes the feature map is a line of :data:`GRID_BACKBONES` (``options.backbone``): a function
``(options, weights, device) -> backbone`` whose result has ``name`` (str; architecture, input size, weights file),
``feature_dim`` (int, the channels of its maps together), ``classifier`` (``float [N, C0] -> logits [N, K]`` on the
final map's channels, or None), ``num_classes`` (K, 0 without a classifier), ``input_shape(height, width) -> (h,
w)`` (the pixels it reads an image of that size at: images of one input shape share a forward pass, so no image is
padded to another's size) and ``forward(images) -> (maps, sizes)``: uint8 [H, W, 3] RGB arrays of one input shape ->
float maps [B, C_k, h_k, w_k] (the final map first, then any other levels; each covering the whole input, no
padding) and the input (height, width) of each image. Optional: ``label(index) -> str``, the class's short name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from vlbert.detectors.backbone import (
    PACKAGED_ARCHITECTURE,
    BackboneRegionExtractor,
    TimmOptions,
    load_timm_backbone,
    packaged_efficientnet_lite0_weights,
    write_random_timm_weights,
)
from vlbert.detectors.butd_vg import ButdGridBackbone, write_random_butd_weights
from vlbert.detectors.images import run_in_shape_groups, to_rgb_array
from vlbert.detectors.regions import Regions


class TimmGridBackbone:
    """A timm ImageNet backbone as a grid backbone (the ``timm`` line of :data:`GRID_BACKBONES`): the model of
    :func:`vlbert.detectors.backbone.load_timm_backbone` and the preprocessing of
    :meth:`vlbert.detectors.backbone.BackboneRegionExtractor.feature_maps` (every image resized to
    ``input_size`` x ``input_size`` pixels, bilinear with antialiasing, normalised by the model's mean and std), its
    ``forward_head`` as the classifier.

    Args:
        options: the grid options (``architecture``, ``input_size``, ``low_level_stage``).
        weights: the weights file; "" = the packaged EfficientNet-Lite0 ImageNet weights.
        device: where the backbone runs.
    Raises:
        ValueError, FileNotFoundError, ModuleNotFoundError: from :func:`load_timm_backbone` (an unknown
            architecture, weights that do not fit) and :class:`BackboneRegionExtractor` (``low_level_stage`` no
            feature level of the model).
    """

    def __init__(self, options: "GridOptions", weights: str, device: str | torch.device = "cpu"):
        stage = options.low_level_stage if options.low_level_stage >= 0 else None
        model = load_timm_backbone(options.architecture, weights or None)
        self._extractor = BackboneRegionExtractor(
            model=model, input_size=options.input_size, device=device, low_level_stage=stage
        )
        self.model = self._extractor.model
        self.input_size = options.input_size
        self.num_classes = int(getattr(self.model, "num_classes", 0) or 0)
        self.feature_dim = self._extractor.feature_dim
        self.classifier = self._classify if self.num_classes else None
        file = Path(weights).name if weights else Path(packaged_efficientnet_lite0_weights()).name
        level = f"+stage{stage}" if stage is not None else ""
        self.name = f"timm:{options.architecture}@{options.input_size}{level}(weights={file})"

    def input_shape(self, height: int, width: int) -> tuple[int, int]:
        """(input_size, input_size): every image is read at the same square size, so any images share a batch."""
        return self.input_size, self.input_size

    def forward(self, images: list[np.ndarray]) -> tuple[list[torch.Tensor], list[tuple[int, int]]]:
        """uint8 [H, W, 3] RGB arrays -> ([final map float32 [B, C, h, w], low-level map [B, C_low, h', w'] where
        ``low_level_stage`` >= 0], [(input_size, input_size)] * B).

        Raises:
            ValueError: the model gives no feature map (a transformer's tokens).
        """
        final, low = self._extractor.feature_maps(images)
        return [final] + ([low] if low is not None else []), [(self.input_size, self.input_size)] * len(images)

    def _classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """float [N, C] (final-map channels) -> logits [N, num_classes]: ``forward_head`` on a 1 x 1 map."""
        return self.model.forward_head(pooled[:, :, None, None])

    def label(self, index: int) -> str:
        """A class's short name (ImageNet's description for a 1,000-class head, else ``class <index>``)."""
        return self._extractor.label(index)


#: What makes the feature map (``detector.options.backbone``): name -> ``(options, weights, device) -> backbone``
#: (the interface in the module's docstring).
GRID_BACKBONES: dict[str, Callable[..., Any]] = {
    "timm": TimmGridBackbone,
    "butd": ButdGridBackbone,
}


_TIMM = {f.name: f for f in fields(TimmOptions)}


@dataclass
class GridOptions:
    """The ``grid`` backend's options (``detector.options``; each field's ``help`` is its
    ``vlbert extract`` flag's text). All of them change the features (the backend's table line).

    Raises:
        ValueError: from :meth:`validate`, naming the field and the fix.
    """

    backbone: str = field(
        default="timm",
        metadata={"help": f"what makes the feature map: one of {', '.join(GRID_BACKBONES)}"},
    )
    # The timm backbone's fields are the timm backend's (one default, one flag and one help for both backends).
    architecture: str = field(default=PACKAGED_ARCHITECTURE, metadata=_TIMM["architecture"].metadata)
    input_size: int = field(default=_TIMM["input_size"].default, metadata=_TIMM["input_size"].metadata)
    grid_size: int = field(
        default=6,
        metadata={
            "help": "cells per side the final feature map is average-pooled to, each cell a region: 6 gives 36, "
            "the timm backend's default region count, so a model reads as many visual tokens either way; at most "
            "the map's side (7 for a stride-32 backbone at 224 pixels)"
        },
    )
    low_level_stage: int = field(default=_TIMM["low_level_stage"].default, metadata=_TIMM["low_level_stage"].metadata)

    def validate(self, weights: str) -> None:
        """Raise ``ValueError`` for an unknown backbone, sizes out of range, or (backbone ``timm``) another
        architecture than the packaged one without a ``weights`` file (timm would give random weights)."""
        if self.backbone not in GRID_BACKBONES:
            raise ValueError(
                f"detector.options.backbone must be one of {', '.join(GRID_BACKBONES)}, got {self.backbone!r}"
            )
        if self.grid_size < 1:
            raise ValueError(
                f"detector.options.grid_size must be >= 1 (cells per side; 1 = the whole image), got {self.grid_size}"
            )
        if self.backbone == "butd" and not weights:
            raise ValueError(
                "the grid backend's butd backbone needs BUTD's weights: detector.weights (--weights), "
                "py-bottom-up-attention's faster_rcnn_from_caffe_attr.pkl"
            )
        if self.backbone == "timm":
            TimmOptions(
                architecture=self.architecture, input_size=self.input_size, low_level_stage=self.low_level_stage
            ).validate(weights)


def cell_boxes(height: int, width: int, grid_size: int) -> np.ndarray:
    """float32 [grid_size^2, 4]: the cells of a ``height`` x ``width`` image (pixels), (x1, y1, x2, y2), row-major;
    cell (r, c) spans x in [c W / G, (c + 1) W / G] and y in [r H / G, (r + 1) H / G]. Neighbours share their edge
    exactly (one float32 value), so the cells tile the image with no gap and no overlap."""
    xs = np.linspace(0.0, float(width), grid_size + 1).astype(np.float32)
    ys = np.linspace(0.0, float(height), grid_size + 1).astype(np.float32)
    x1, y1 = np.meshgrid(xs[:-1], ys[:-1])
    x2, y2 = np.meshgrid(xs[1:], ys[1:])
    return np.stack([x1.ravel(), y1.ravel(), x2.ravel(), y2.ravel()], axis=1)


class GridExtractor:
    """Image -> :class:`~vlbert.detectors.regions.Regions`: grid_size x grid_size cells of a backbone's feature map
    (the module's docstring says what each cell's box, feature, class distribution and score are).

    Args:
        backbone: a grid backbone (a line of :data:`GRID_BACKBONES` built).
        grid_size: cells per side.
    Raises:
        ValueError: ``grid_size`` < 1.
    """

    def __init__(self, backbone, grid_size: int):
        if grid_size < 1:
            raise ValueError(f"grid_size must be >= 1, got {grid_size}")
        self.backbone = backbone
        self.grid_size = grid_size
        self.name = f"grid{grid_size}x{grid_size}:{backbone.name}"

    @property
    def feature_dim(self) -> int:
        """The size of a cell's feature: the backbone's maps' channels together."""
        return int(self.backbone.feature_dim)

    @property
    def num_classes(self) -> int:
        """The size of a cell's class distribution (0: the backbone has no classifier, class_probs None)."""
        return int(self.backbone.num_classes)

    def label(self, index: int) -> str:
        """A class's short name (the backbone's, else ``class <index>``)."""
        label = getattr(self.backbone, "label", None)
        return label(index) if label is not None else f"class {index}"

    def metadata(self) -> dict:
        """What travels with the shards (``detector.json``): the extractor's name, feature size and the classifier's
        class names (None without a classifier)."""
        names = [self.label(i) for i in range(self.num_classes)] if self.num_classes else None
        return {"detector": self.name, "feature_dim": self.feature_dim, "class_names": names}

    def __call__(self, image, image_id: str) -> Regions:
        """The grid_size^2 cells of one image (a PIL image or uint8 [H, W, 3] RGB array).

        Returns:
            :class:`Regions`: boxes float32 [G^2, 4] in the image's pixels (x1, y1, x2, y2), features float16
            [G^2, feature_dim], scores float32 [G^2], class_probs float16 [G^2, num_classes] or None.
        Raises:
            ValueError: the backbone's feature map is smaller than grid_size on a side (the fix said).
        """
        return self.extract_batch([image], [image_id])[0]

    @torch.no_grad()
    def extract_batch(self, images: list, image_ids: list[str], batch_size: int | None = None) -> list[Regions]:
        """:meth:`__call__` for several images, in input order. Images of one input shape (the backbone's
        ``input_shape``) share a forward pass, at most ``batch_size`` (default all): no image is padded to
        another's size, so the result equals one image at a time up to float rounding.

        Raises:
            ValueError: see :meth:`__call__`.
        """
        arrays = [to_rgb_array(im) for im in images]
        shapes = [tuple(self.backbone.input_shape(a.shape[0], a.shape[1])) for a in arrays]
        return run_in_shape_groups(
            shapes, batch_size, lambda group: self._forward([arrays[i] for i in group], [image_ids[i] for i in group])
        )

    def _forward(self, arrays: list[np.ndarray], image_ids: list[str]) -> list[Regions]:
        g = self.grid_size
        maps, _ = self.backbone.forward(arrays)
        h, w = maps[0].shape[-2:]
        if min(h, w) < g:
            raise ValueError(
                f"detector.options.grid_size {g} exceeds the backbone's {h}x{w} feature map (cells would repeat "
                f"its positions); use grid_size <= {min(h, w)} or a larger input_size"
            )
        pooled = [torch.nn.functional.adaptive_avg_pool2d(m.float(), g).flatten(2).transpose(1, 2) for m in maps]
        features = torch.cat(pooled, dim=2)  # [B, G^2, D], row-major cells
        n = len(arrays)
        probs = None
        if self.backbone.classifier is not None:
            final = pooled[0]
            probs = self.backbone.classifier(final.reshape(n * g * g, -1)).float().softmax(-1).reshape(n, g * g, -1)
        out = []
        for k, (a, image_id) in enumerate(zip(arrays, image_ids, strict=True)):
            height, width = a.shape[:2]
            p = probs[k].cpu().numpy() if probs is not None else None
            out.append(
                Regions(
                    image_id,
                    height,
                    width,
                    cell_boxes(height, width, g),
                    features[k].cpu().numpy(),
                    p.max(-1) if p is not None else np.ones(g * g, np.float32),
                    p,
                    detector=self.name,
                )
            )
        return out


def build_grid_extractor(options: GridOptions, weights: str, device: str = "cpu") -> GridExtractor:
    """The ``grid`` backend's build (its line of :data:`vlbert.detectors.backends.DETECTOR_BACKENDS`): the
    ``options.backbone`` line of :data:`GRID_BACKBONES` with ``weights`` ("" = its default: the packaged
    EfficientNet-Lite0 ImageNet weights for ``timm``), cut into ``options.grid_size`` cells per side.

    Raises:
        ValueError, FileNotFoundError, ModuleNotFoundError: the backbone's (an unknown architecture, weights that
            do not fit, a missing package).
    """
    return GridExtractor(GRID_BACKBONES[options.backbone](options, weights, device), options.grid_size)


def write_random_grid_weights(options: GridOptions, path: str | os.PathLike) -> None:
    """Write seeded random weights of the backbone to ``path``: the ``timm`` backbone's ``options.architecture``
    (:func:`vlbert.detectors.backbone.write_random_timm_weights`) or BUTD's detector
    (:func:`vlbert.detectors.butd_vg.write_random_butd_weights`): the weights a benchmark times with, never
    features to learn from.

    Raises:
        ValueError: a backbone with no random weights here.
    """
    if options.backbone == "butd":
        write_random_butd_weights(options, path)
    elif options.backbone == "timm":
        write_random_timm_weights(options, path)
    else:
        raise ValueError(f"the grid backbone {options.backbone!r} has no random weights for benchmarks")


__all__ = [
    "GRID_BACKBONES",
    "GridExtractor",
    "GridOptions",
    "TimmGridBackbone",
    "build_grid_extractor",
    "cell_boxes",
    "write_random_grid_weights",
]
