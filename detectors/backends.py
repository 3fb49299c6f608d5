"""The detector backends, one line each: how images become regions (``detector.backend``).

A backend is a module with its options (a dataclass: each field with a default and a ``help`` in its metadata,
and ``validate(weights)``), a build function ``(options, weights, device) -> extractor`` (a callable
``(image, image_id) -> Regions`` with ``extract_batch(images, image_ids)``, ``name`` and ``feature_dim``), and its
line in :data:`DETECTOR_BACKENDS` naming the options fields that change the features (the fingerprint's). The
config (:class:`vlbert.detectors.config.DetectorConfig`), the run configs' ``detector`` section and the flags of
``vlbert extract`` and ``vlbert benchmark extraction`` all read this table; docs/extending.md
"A detector backend" walks adding one.

Backends:
  * ``timm``: Felzenszwalb proposals + the whole image, RoI-aligned on any timm ImageNet backbone
    (:mod:`vlbert.detectors.backbone`; offline with the packaged EfficientNet-Lite0 weights);
  * ``torchvision``: Faster R-CNN R50-FPN with BUTD's box selection (:mod:`vlbert.detectors.torchvision_detector`);
  * ``butd``: BUTD's Visual Genome Faster R-CNN (UNITER's and LXMERT's features) in plain PyTorch
    (:mod:`vlbert.detectors.butd_vg`); its regions are the detectron2 backend's with ``config_file: butd-vg``, and
    are named as those (``same_features_as``);
  * ``detectron2``: any other detectron2 Faster R-CNN (:mod:`vlbert.detectors.detectron2_options`; needs detectron2);
  * ``grid``: grid features, a backbone's feature map cut into cells (:mod:`vlbert.detectors.grid`; timm's or BUTD's).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

from vlbert.detectors.backbone import (
    TimmOptions,
    build_timm_extractor,
    write_random_timm_weights,
)
from vlbert.detectors.butd_vg import ButdOptions, build_butd_detector, write_random_butd_weights
from vlbert.detectors.detectron2_options import (
    Detectron2Options,
    as_detectron2_options,
    build_detectron2_detector,
    config_file_identity,
    write_random_detectron2_weights,
)
from vlbert.detectors.grid import GridOptions, build_grid_extractor, write_random_grid_weights
from vlbert.detectors.torchvision_detector import (
    TorchvisionOptions,
    build_torchvision_detector,
    write_random_torchvision_weights,
)


@dataclass(frozen=True)
class DetectorBackend:
    """One line of :data:`DETECTOR_BACKENDS`.

    Attributes:
        options: the backend's options dataclass (``detector.options``).
        build: ``(options, weights: str, device: str) -> extractor``; ``weights`` "" = the backend's default.
        feature_fields: the options fields that change the features, in the fingerprint's order (with the backend
            and the weights' identity, always).
        summary: one line for ``--help`` (what it detects with, what it needs).
        identities: field -> function of its value giving what of it changes the features (a config file by its
            content, not its directory); fields not named count by value.
        unrecorded: field -> the value it had before it was a field, left out of the fingerprint so that features
            extracted then keep their name (timm's ``architecture``: ``efficientnet_lite0``).
        pools_given_boxes: the extractor pools boxes it is given (``extract_batch(images, ids, boxes)``) instead of
            detecting its own.
        random_weights: ``(options, path) -> None`` writing seeded random weights, for benchmarks; None = none.
        same_features_as: ``options -> (backend, its options)``: another backend's line that computes the same
            features; fingerprints and comparisons are that one's, so a model trained on regions of either accepts
            the other's. None = its own.
    """

    options: type
    build: Callable[..., Any]
    feature_fields: tuple[str, ...]
    summary: str
    identities: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    unrecorded: dict[str, Any] = field(default_factory=dict)
    pools_given_boxes: bool = False
    random_weights: Callable[[Any, str], None] | None = None
    same_features_as: Callable[[Any], tuple[str, Any]] | None = None

    def option_names(self) -> tuple[str, ...]:
        """The names of the options fields, in order."""
        return tuple(f.name for f in fields(self.options))


DETECTOR_BACKENDS: dict[str, DetectorBackend] = {
    "timm": DetectorBackend(
        TimmOptions,
        build_timm_extractor,
        ("architecture", "input_size", "roi_output_size", "max_proposals", "low_level_stage"),
        "Felzenszwalb proposals RoI-aligned on a timm ImageNet backbone (offline default)",
        unrecorded={"architecture": "efficientnet_lite0"},
        pools_given_boxes=True,
        random_weights=write_random_timm_weights,
    ),
    "torchvision": DetectorBackend(
        TorchvisionOptions,
        build_torchvision_detector,
        ("min_boxes", "max_boxes", "score_threshold"),
        "torchvision's Faster R-CNN R50-FPN, BUTD's box selection",
        random_weights=write_random_torchvision_weights,
    ),
    "butd": DetectorBackend(
        ButdOptions,
        build_butd_detector,
        ("min_boxes", "max_boxes", "score_threshold", "nms_iou"),
        "BUTD's Visual Genome Faster R-CNN with attributes (UNITER's, LXMERT's features), plain PyTorch",
        random_weights=write_random_butd_weights,
        same_features_as=lambda options: ("detectron2", as_detectron2_options(options)),
    ),
    "detectron2": DetectorBackend(
        Detectron2Options,
        build_detectron2_detector,
        ("config_file", "min_boxes", "max_boxes", "score_threshold", "nms_iou", "overrides"),
        "any detectron2 Faster R-CNN (config_file butd-vg: the butd backend's model); needs detectron2",
        identities={"config_file": config_file_identity},
        random_weights=write_random_detectron2_weights,
    ),
    "grid": DetectorBackend(
        GridOptions,
        build_grid_extractor,
        ("backbone", "architecture", "input_size", "grid_size", "low_level_stage"),
        "grid features: a backbone's feature map cut into grid_size x grid_size cells (offline default)",
        random_weights=write_random_grid_weights,
    ),
}
#: The backend of a config that names none: the one that runs offline.
DEFAULT_BACKEND = "timm"


def backend_list(names) -> str:
    """Backend names in words: "the timm backend", "the torchvision, butd and detectron2 backends"."""
    names = list(names)
    if len(names) == 1:
        return f"{names[0]} backend"
    return f"{', '.join(names[:-1])} and {names[-1]} backends"


def detector_backend(name: str) -> DetectorBackend:
    """The line of :data:`DETECTOR_BACKENDS` named ``name``.

    Raises:
        ValueError: no such backend (the names said).
    """
    if name not in DETECTOR_BACKENDS:
        raise ValueError(f"detector.backend must be one of {', '.join(DETECTOR_BACKENDS)}, got {name!r}")
    return DETECTOR_BACKENDS[name]


__all__ = ["DetectorBackend", "DETECTOR_BACKENDS", "DEFAULT_BACKEND", "detector_backend", "backend_list"]
