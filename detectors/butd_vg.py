"""BUTD's Visual Genome detector in plain PyTorch: the ``butd`` detector backend, which needs no detectron2.

The model is bottom-up attention's (Anderson et al. 2018, section 3.1) as py-bottom-up-attention ports it to
detectron2 (``configs/VG-Detection/faster_rcnn_R_101_C4_attr_caffemaxpool.yaml``; its weights
``faster_rcnn_from_caffe_attr.pkl``): a Caffe ResNet-101 up to res4 with Caffe's stem max pool and the stride in the
1x1 convolutions (:mod:`vlbert.detectors.caffe_resnet`), an RPN on res4 (torchvision's ``RPNHead``; 12 anchors a
position, sizes 64-512 at aspect ratios 0.5, 1, 2, stride 16), RoIPool 14x14 of each proposal on res4
(``torchvision.ops.roi_pool``), res5 and a mean pool (2048-d), 1600 object classes and the attribute head (400
attributes). Regions are chosen as the authors' ``generate_tsv.py`` does (:func:`vlbert.detectors.selection.butd_regions`):
the proposals themselves, per-class NMS 0.3, confidence >= 0.2, 10-100 boxes.

Each step does what the detectron2 backend (:mod:`vlbert.detectors.detectron2_detector` with ``config_file: butd-vg``)
does with the same weights, so the two give the same regions (tests/regions/test_butd_vg.py compares them):

* the image is resized as detectron2's ``ResizeShortestEdge`` (shortest side 600, longest at most 1000, Pillow's
  bilinear resize of the uint8 image), turned to BGR and the Caffe means subtracted;
* anchors are detectron2's ``DefaultAnchorGenerator``'s: torchvision's ``AnchorGenerator`` rounds its cell anchors
  to whole pixels and orders them by aspect ratio first, and its ``forward`` derives the stride from the image and
  feature sizes (600 // 38 = 15 where the network's stride is 16), so :class:`DetectronAnchors` keeps torchvision's
  grid and sets the cell anchors and the stride as detectron2 does;
* proposals are detectron2's ``find_top_rpn_proposals`` (:func:`rpn_proposals`): the 6000 best objectness logits,
  decoded with torchvision's ``BoxCoder``, clipped, empty boxes dropped, NMS 0.7 on the logits
  (``torchvision.ops.batched_nms``), the first 300 kept. torchvision's ``RegionProposalNetwork`` runs NMS on
  sigmoid scores, which tie where large logits round to 1.0, and drops boxes under 1e-3 pixels rather than empty
  ones.

The settings come from the packaged config file (``butd-vg``, :data:`vlbert.detectors.files.BUTD_VG_CONFIG_FILE`), the one
the detectron2 backend reads; the network's sizes (depth, widths, classes, attributes) come from the weights file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import vlbert.detectors.butd_model as butd_model
from vlbert.detectors.butd_model import ButdSettings, load_butd_model, random_butd_state
from vlbert.detectors.files import read_vocabulary
from vlbert.detectors.images import run_in_shape_groups, to_rgb_array
from vlbert.detectors.regions import Regions
from vlbert.detectors.selection import BoxSelection, butd_regions, check_box_selection


# ------------------------------------------------------------------------------------------------ images
def resized_shape(height: int, width: int, short: int, max_size: int) -> tuple[int, int]:
    """(height, width) after detectron2's ``ResizeShortestEdge.get_output_shape``: the shorter side to ``short``,
    then both scaled down if the longer exceeds ``max_size``, each rounded half up."""
    scale = short / min(height, width)
    h, w = (float(short), scale * width) if height < width else (scale * height, float(short))
    if max(h, w) > max_size:
        scale = max_size / max(h, w)
        h, w = h * scale, w * scale
    return int(h + 0.5), int(w + 0.5)


def butd_input(array: np.ndarray, settings: ButdSettings) -> torch.Tensor:
    """uint8 [H, W, 3] RGB -> the network's input: float32 [3, h, w], BGR 0-255, resized as ``settings`` say
    (:func:`resize_shortest_edge`), not normalised (the model subtracts the means)."""
    resized = resize_shortest_edge(array, settings.min_size_test, settings.max_size_test)
    return torch.as_tensor(np.ascontiguousarray(resized[:, :, ::-1].transpose(2, 0, 1)), dtype=torch.float32)


def resize_shortest_edge(array: np.ndarray, short: int, max_size: int) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [h, w, 3] (:func:`resized_shape`) by Pillow's bilinear resize, as detectron2's
    ``ResizeTransform.apply_image`` resizes uint8 images."""
    from PIL import Image

    h, w = resized_shape(array.shape[0], array.shape[1], short, max_size)
    if (h, w) == array.shape[:2]:
        return array
    return np.asarray(Image.fromarray(array).resize((w, h), Image.BILINEAR))


# ------------------------------------------------------------------------------------------------ the extractor
class ButdRegionDetector:
    """Image -> :class:`~vlbert.detectors.regions.Regions` with BUTD's Visual Genome detector in plain PyTorch
    (module docstring): the regions the detectron2 backend gives with ``config_file: butd-vg`` and the same weights.

    Args:
        weights: the detector's weights (``faster_rcnn_from_caffe_attr.pkl``; :func:`load_butd_model`).
        device: where the model runs ("cpu", "cuda", "cuda:1").
        selection: BUTD's box selection (10-100 boxes at confidence 0.2, per-class NMS 0.3).
        class_names, attribute_names: Visual Genome's ``objects_vocab.txt`` / ``attributes_vocab.txt`` (one name
            per line); default ``class_<i>`` / ``attribute_<i>``.
        settings: the config file's settings (default: the packaged ``butd-vg``).
        name: the name its regions carry (default: the detectron2 backend's for ``butd-vg``, so that regions of
            either backend are the same features to every check).
    Raises:
        FileNotFoundError, ValueError: from :func:`load_butd_model`; a names file of the wrong length.
    """

    def __init__(
        self,
        weights: str | os.PathLike,
        device: str = "cpu",
        selection: BoxSelection = BoxSelection(),
        class_names: str | os.PathLike | None = None,
        attribute_names: str | os.PathLike | None = None,
        settings: ButdSettings | None = None,
        name: str | None = None,
    ):
        self.settings = settings if settings is not None else butd_model.BUTD_VG_SETTINGS
        self.model = load_butd_model(weights, self.settings, device)
        self.device = torch.device(device)
        self.selection = selection
        a = self.model.architecture
        self.class_names = (
            read_vocabulary(class_names, a.num_classes, "class")
            if class_names
            else [f"class_{i}" for i in range(a.num_classes)]
        )
        self.attribute_names = None
        if a.attributes is not None:
            count = a.attributes[0]
            self.attribute_names = (
                read_vocabulary(attribute_names, count, "attribute")
                if attribute_names
                else [f"attribute_{i}" for i in range(count)]
            )
        self.name = name or butd_extractor_name(weights, selection)

    @property
    def feature_dim(self) -> int:
        """2048 for BUTD's ResNet-101."""
        return self.model.feature_dim

    def metadata(self) -> dict:
        """What travels with the shards (``detector.json``): the extractor's name, feature size, class and
        attribute names (None without an attribute head)."""
        return {
            "detector": self.name,
            "feature_dim": self.feature_dim,
            "class_names": self.class_names,
            "attribute_names": self.attribute_names,
        }

    def _prepare(self, array: np.ndarray) -> torch.Tensor:
        """uint8 [H, W, 3] RGB -> float32 [3, h, w] BGR 0-255, resized as the config says (:func:`butd_input`)."""
        return butd_input(array, self.settings)

    def __call__(self, image, image_id: str) -> Regions:
        """One image (PIL image or uint8 array, any mode :func:`vlbert.detectors.images.to_rgb_array` converts)."""
        return self.extract_batch([image], [image_id])[0]

    @torch.no_grad()
    def extract_batch(self, images: list, image_ids: list[str], batch_size: int | None = None) -> list[Regions]:
        """:meth:`__call__` for several images; images of equal resized size share a forward pass (at most
        ``batch_size``, default all), so the result equals one image at a time. Output in input order."""
        arrays = [to_rgb_array(im) for im in images]
        prepared = [self._prepare(a) for a in arrays]
        return run_in_shape_groups(
            [tuple(t.shape) for t in prepared],
            batch_size,
            lambda group: self._forward(
                torch.stack([prepared[i] for i in group]).to(self.device),
                [arrays[i].shape[:2] for i in group],
                [image_ids[i] for i in group],
            ),
        )

    def _forward(self, images: torch.Tensor, sizes: list[tuple[int, int]], image_ids: list[str]) -> list[Regions]:
        proposals, features, class_probs = self.model(images)
        resized = tuple(images.shape[-2:])
        out, start = [], 0
        for boxes, size, image_id in zip(proposals, sizes, image_ids, strict=True):
            span = slice(start, start + len(boxes))
            start += len(boxes)
            out.append(
                butd_regions(
                    image_id,
                    tuple(size),
                    resized,
                    boxes,
                    class_probs[span],
                    features[span],
                    self.name,
                    self.selection,
                    self.model.attribute_predictor,
                )
            )
        return out


class ButdGridBackbone:
    """BUTD's detector as a grid backbone (the ``butd`` line of :data:`vlbert.detectors.grid.GRID_BACKBONES`): its
    res5 over the whole image (:meth:`~vlbert.detectors.butd_model.ButdVisualGenomeModel.feature_map`, 2048-d,
    stride 32) at the config's sizes (shortest side 600, longest at most 1000), its object classifier over the 1600
    Visual Genome classes (background left out) as the cells' class distribution.

    Args:
        options: the grid options (only ``backbone`` applies; the architecture is the weights file's).
        weights: BUTD's weights (``faster_rcnn_from_caffe_attr.pkl``).
        device: where it runs.
    Raises:
        FileNotFoundError, ValueError: from :func:`~vlbert.detectors.butd_model.load_butd_model`.
    """

    def __init__(self, options, weights: str, device: str | torch.device = "cpu"):
        self.settings = butd_model.BUTD_VG_SETTINGS
        self.model = load_butd_model(weights, self.settings, device)
        self.device = torch.device(device)
        self.feature_dim = self.model.feature_dim
        self.num_classes = self.model.architecture.num_classes
        self.classifier = lambda pooled: self.model.cls_score(pooled)[:, :-1]
        self.name = f"butd-vg:res5(weights={Path(str(weights)).name})"

    def input_shape(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) an image is resized to (:func:`resized_shape`)."""
        return resized_shape(height, width, self.settings.min_size_test, self.settings.max_size_test)

    def forward(self, images: list[np.ndarray]) -> tuple[list[torch.Tensor], list[tuple[int, int]]]:
        """uint8 [H, W, 3] RGB arrays of one :meth:`input_shape` -> ([C5 float32 [B, 2048, h, w]], their resized
        (height, width))."""
        batch = torch.stack([butd_input(a, self.settings) for a in images])
        return [self.model.feature_map(batch.to(self.device))], [tuple(batch.shape[-2:])] * len(images)


def butd_extractor_name(weights: str | os.PathLike, selection: BoxSelection) -> str:
    """The name BUTD regions carry, the detectron2 backend's for ``config_file: butd-vg``:
    ``detectron2:butd-vg(weights=<file name>,thr=..,boxes=min-max,nms=..)``. It names the features (the published
    families record UNITER's and LXMERT's under it), not the code that computed them."""
    return (
        f"detectron2:butd-vg(weights={Path(str(weights)).name},thr={selection.score_threshold},"
        f"boxes={selection.min_boxes}-{selection.max_boxes},nms={selection.nms_iou})"
    )


# ------------------------------------------------------------------------------------------------ the backend
@dataclass
class ButdOptions:
    """The ``butd`` backend's options (``detector.options``; each field's ``help`` is its ``vlbert extract``
    flag's text). The model is fixed (``butd-vg``); these are BUTD's box selection and the vocabulary files, which
    do not change the features.

    Raises:
        ValueError: from :meth:`validate`, naming the field.
    """

    min_boxes: int = field(default=10, metadata={"help": "BUTD's minimum boxes per image"})
    max_boxes: int = field(default=100, metadata={"help": "BUTD's maximum boxes per image"})
    score_threshold: float = field(default=0.2, metadata={"help": "BUTD's class confidence threshold"})
    nms_iou: float = field(default=0.3, metadata={"help": "BUTD's per-class NMS IoU over the proposals"})
    class_names: str = field(default="", metadata={"help": "object vocabulary file, one name per line"})
    attribute_names: str = field(default="", metadata={"help": "attribute vocabulary file, one name per line"})

    def selection(self) -> BoxSelection:
        """These options' :class:`~vlbert.detectors.selection.BoxSelection`."""
        return BoxSelection(self.min_boxes, self.max_boxes, self.score_threshold, self.nms_iou)

    def extractor_name(self, weights: str) -> str:
        """The name the regions of these options and ``weights`` carry (:func:`butd_extractor_name`)."""
        return butd_extractor_name(weights, self.selection())

    def validate(self, weights: str) -> None:
        """Raise ``ValueError`` without ``weights`` (the detector's weights are not packaged) or for box selection
        settings out of range."""
        if not weights:
            raise ValueError(
                "the butd backend needs the detector's weights: detector.weights (--weights), "
                "py-bottom-up-attention's faster_rcnn_from_caffe_attr.pkl"
            )
        check_box_selection(self.min_boxes, self.max_boxes, self.score_threshold, self.nms_iou)


def build_butd_detector(options: ButdOptions, weights: str, device: str = "cpu") -> ButdRegionDetector:
    """The ``butd`` backend's build: :class:`ButdRegionDetector` of the options.

    Raises:
        FileNotFoundError, ValueError: from :class:`ButdRegionDetector`.
    """
    return ButdRegionDetector(
        weights,
        device,
        options.selection(),
        class_names=options.class_names or None,
        attribute_names=options.attribute_names or None,
    )


def write_random_butd_weights(options: ButdOptions, path: str | os.PathLike) -> None:
    """Write :func:`random_butd_state` (BUTD's full sizes: ResNet-101, 1600 classes, 400 attributes) to ``path``, for
    benchmarks: a ``.pkl`` in py-bottom-up-attention's layout ({"model": name -> array, "__author__": ...}), any
    other name as a ``torch.save`` state dict."""
    state = random_butd_state()
    if Path(path).suffix == ".pkl":
        import pickle

        Path(path).write_bytes(pickle.dumps({"model": state, "__author__": "vlbert random weights"}))
    else:
        torch.save({k: torch.from_numpy(v) for k, v in state.items()}, path)


__all__ = [
    "resized_shape",
    "resize_shortest_edge",
    "butd_input",
    "ButdRegionDetector",
    "ButdGridBackbone",
    "butd_extractor_name",
    "ButdOptions",
    "build_butd_detector",
    "write_random_butd_weights",
]
