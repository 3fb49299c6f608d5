"""The ``detectron2`` detector backend's options and build (its line of
:data:`vlbert.detectors.backends.DETECTOR_BACKENDS`): any detectron2 Faster R-CNN, BUTD's box selection, the BUTD
Visual Genome model with attributes as ``config_file: butd-vg`` (:mod:`vlbert.detectors.detectron2_detector`)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from vlbert.detectors.butd_vg import ButdOptions, build_butd_detector
from vlbert.detectors.detectron2_detector import Detectron2RegionDetector, extractor_name, load_config
from vlbert.detectors.files import BUTD_VG_CONFIG_FILE, file_sha256
from vlbert.detectors.selection import check_box_selection

logger = logging.getLogger(__name__)


def _has_detectron2() -> bool:
    import importlib.util

    return importlib.util.find_spec("detectron2") is not None


def config_file_identity(config_file: str) -> str:
    """What a detectron2 ``config_file`` value says about the model, without its directory: ``butd-vg`` for the
    packaged BUTD config (by name or by a path to it), ``sha256:<16 hex>`` of another existing file's content,
    else the value itself (a model-zoo name such as ``COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml``)."""
    if not config_file or config_file == "butd-vg":
        return config_file
    path = Path(config_file).expanduser()
    if not path.is_file():
        return config_file
    digest = file_sha256(path)
    return "butd-vg" if digest == file_sha256(BUTD_VG_CONFIG_FILE) else "sha256:" + digest[:16]


@dataclass
class Detectron2Options:
    """The ``detectron2`` backend's options (``detector.options``; each field's ``help`` is its
    ``vlbert extract`` flag's text). ``class_names`` and ``attribute_names`` do not change the features,
    so the backend's table line leaves them out of the fingerprint.

    Raises:
        ValueError: from :meth:`validate`, naming the field.
    """

    config_file: str = field(
        default="",
        metadata={
            "help": "the model's config file, butd-vg (BUTD's Visual Genome model with attributes) or a model-zoo "
            "name such as COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml"
        },
    )
    min_boxes: int = field(default=10, metadata={"help": "BUTD's minimum boxes per image"})
    max_boxes: int = field(default=100, metadata={"help": "BUTD's maximum boxes per image"})
    score_threshold: float = field(default=0.2, metadata={"help": "BUTD's class confidence threshold"})
    nms_iou: float = field(default=0.3, metadata={"help": "BUTD's per-class NMS IoU over the proposals"})
    overrides: dict = field(
        default_factory=dict,
        metadata={"help": "config overrides, KEY VALUE ... (values read as YAML)", "flag": "--opts"},
    )
    class_names: str = field(default="", metadata={"help": "object vocabulary file, one name per line"})
    attribute_names: str = field(default="", metadata={"help": "attribute vocabulary file, one name per line"})

    def extractor_name(self, weights: str) -> str:
        """The name the backend built from these options and ``weights`` writes into its regions
        (:func:`~vlbert.detectors.detectron2_detector.extractor_name`), known without building it."""
        return extractor_name(
            self.config_file, weights, self.min_boxes, self.max_boxes, self.score_threshold, self.nms_iou
        )

    def validate(self, weights: str) -> None:
        """Raise ``ValueError`` without ``config_file`` or ``weights`` (detectron2 has no default model), or for
        settings out of range."""
        if not (self.config_file and weights):
            raise ValueError(
                "the detectron2 backend needs a config file and weights: detector.options.config_file "
                "and detector.weights (--config-file and --weights)"
            )
        check_box_selection(self.min_boxes, self.max_boxes, self.score_threshold, self.nms_iou)
        if not isinstance(self.overrides, dict):
            raise ValueError(
                f"detector.options.overrides must be a mapping of detectron2 config keys to values, "
                f"got {self.overrides!r}"
            )


def build_detectron2_detector(
    options: Detectron2Options, weights: str, device: str = "cpu"
) -> Detectron2RegionDetector:
    """The ``detectron2`` backend's build: :class:`Detectron2RegionDetector` of the options. Where detectron2 is
    not installed and the options are BUTD's model as packaged (``config_file: butd-vg``, no overrides), the
    ``butd`` backend's detector, which extracts the same regions without detectron2 (a run recorded before the
    ``butd`` backend existed answers on a machine without detectron2).

    Raises:
        ModuleNotFoundError, FileNotFoundError, ValueError: from :class:`Detectron2RegionDetector`.
    """
    if config_file_identity(options.config_file) == "butd-vg" and not options.overrides and not _has_detectron2():
        logger.info("detectron2 is not installed: BUTD's butd-vg model runs on the butd backend (the same regions)")
        same = {name: getattr(options, name) for name in ButdOptions.__dataclass_fields__}
        return build_butd_detector(ButdOptions(**same), weights, device)
    return Detectron2RegionDetector(
        options.config_file,
        weights,
        device,
        min_boxes=options.min_boxes,
        max_boxes=options.max_boxes,
        score_threshold=options.score_threshold,
        nms_iou=options.nms_iou,
        overrides=options.overrides,
        class_names=options.class_names or None,
        attribute_names=options.attribute_names or None,
    )


def write_random_detectron2_weights(options: Detectron2Options, path: str | os.PathLike) -> None:
    """Write seeded random weights (seed 0) of the ``config_file`` model to ``path``, for benchmarks: the RPN's
    box deltas zeroed, so that its proposals are distinct anchors as a trained RPN's are (random deltas stretch
    every anchor to the whole image), and the frozen norms' scales at 0.2 (untrained identities overflow through
    100 residual layers)."""
    from detectron2.modeling import build_model

    with torch.random.fork_rng():
        torch.manual_seed(0)
        state = build_model(load_config(options.config_file, options.overrides)).state_dict()
    for key in state:
        if "anchor_deltas" in key:
            state[key].zero_()
        elif key.endswith("norm.weight"):
            state[key].mul_(0.2)
    torch.save(state, path)


def as_detectron2_options(options: ButdOptions) -> Detectron2Options:
    """The detectron2 backend's options that extract the same features (``config_file: butd-vg``, the same box
    selection): what the ``butd`` line's fingerprint and comparisons are made of."""
    return Detectron2Options(
        config_file="butd-vg",
        min_boxes=options.min_boxes,
        max_boxes=options.max_boxes,
        score_threshold=options.score_threshold,
        nms_iou=options.nms_iou,
        class_names=options.class_names,
        attribute_names=options.attribute_names,
    )


__all__ = [
    "as_detectron2_options",
    "Detectron2Options",
    "build_detectron2_detector",
    "config_file_identity",
    "write_random_detectron2_weights",
]
