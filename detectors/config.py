"""One detector configuration for every place that extracts regions: the ``detector`` section of the VL run
configs, the region cache, and ``tools/extract_regions.py`` (whose flags map onto these fields).

Backends:
  * ``timm``: Felzenszwalb proposals + the whole image, RoI-aligned on an ImageNet backbone
    (:class:`detectors.backbone.BackboneRegionExtractor`; works offline with the packaged EfficientNet-Lite0);
  * ``torchvision``: Faster R-CNN R50-FPN with BUTD's box selection
    (:class:`detectors.torchvision_detector.TorchvisionRegionDetector`);
  * ``detectron2``: :class:`detectors.detectron2_detector.Detectron2RegionDetector` (needs detectron2).

What identifies the features a config extracts (:meth:`DetectorConfig.fingerprint`,
:meth:`DetectorConfig.difference`): the backend, the fields that change the numbers, and the weights' identity,
the sha256 of the weights file's content (``weights_sha256``, written at extraction by
:meth:`DetectorConfig.identified`), or where a record has none (a published model's description) the weights
file's name. Never a directory, never a vocabulary file: class and attribute names do not change the features.
docs/regions.md says more.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from vlbert_base.user_files import read_yaml

BACKENDS = ("timm", "torchvision", "detectron2")

#: The fields besides the weights that change what each backend extracts (and so name its cache).
_FIELDS_BY_BACKEND = {
    "timm": ("input_size", "roi_output_size", "max_proposals", "low_level_stage"),
    "torchvision": ("min_boxes", "max_boxes", "score_threshold"),
    "detectron2": ("config_file", "min_boxes", "max_boxes", "score_threshold", "nms_iou", "overrides"),
}
#: The config file of the BUTD Visual Genome model (:mod:`detectors.butd`), named ``butd-vg``.
BUTD_VG_CONFIG_FILE = Path(__file__).parent / "configs" / "butd-vg-R101-C4-attr.yaml"


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file's content, 64 hex digits (read in 1 MiB blocks).

    Raises:
        FileNotFoundError: no such file.
    """
    digest = hashlib.sha256()
    with open(Path(path).expanduser(), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
        class_names, attribute_names: detectron2: vocabulary files (one name per line) written with the shards;
            they do not change the features, so they are no part of the fingerprint.
        weights_sha256: the sha256 (64 hex digits) of the weights file's content; "" = not known (a published
            model's record that knows only the file's name). :meth:`identified` fills it from the file.
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
    weights_sha256: str = ""

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
        if self.weights_sha256 and not re.fullmatch(r"[0-9a-f]{64}", self.weights_sha256):
            raise ValueError(f"detector.weights_sha256 must be 64 lower-case hex digits (sha256sum's output), got "
                             f"{self.weights_sha256!r}")

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

    @classmethod
    def from_record(cls, record: dict) -> "DetectorConfig":
        """The config of a saved record (``detector.json``'s or ``inference.json``'s ``config``), fields this
        version does not know dropped (records written by other versions stay readable).

        Raises:
            ValueError: from :meth:`validate`.
        """
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})

    def weights_identity(self) -> str:
        """``sha256:<hex>`` where the weights' hash is known, else the weights file's name without its directory
        ("" = the backend's default weights)."""
        if self.weights_sha256:
            return "sha256:" + self.weights_sha256
        return Path(self.weights).name if self.weights else ""

    def identified(self) -> "DetectorConfig":
        """This config with ``weights_sha256`` read from the weights file (hashing it: about a second per GB);
        unchanged where ``weights`` is "" (the backend's default) or names no file.

        Raises:
            ValueError: ``weights_sha256`` was given and the file's content has another hash.
        """
        path = Path(self.weights).expanduser()
        if not self.weights or not path.is_file():
            return self
        digest = file_sha256(path)
        if self.weights_sha256 and digest != self.weights_sha256:
            raise ValueError(f"weights file {path} has sha256 {digest[:12]}..., but the detector records "
                             f"{self.weights_sha256[:12]}...: it is not the file the regions were extracted with")
        return replace(self, weights_sha256=digest)

    def with_weights(self, path: str | os.PathLike) -> "DetectorConfig":
        """This config reading its weights from ``path`` (where the user keeps them), after checking they are the
        recorded ones: the same sha256 where this config records one, else the same file name.

        Raises:
            FileNotFoundError: no such file.
            ValueError: other weights (both identities named).
        """
        path = Path(path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"detector weights {path} do not exist; pass the path of the weights file "
                                    f"({Path(self.weights).name or 'the backend default'})")
        candidate = replace(self, weights=str(path), weights_sha256=file_sha256(path))
        why = self.difference(candidate)
        if why is not None:
            raise ValueError(f"detector weights {path} are not the ones the regions were extracted with ({why}); "
                             "pass the weights file the run's detector used")
        return candidate

    def difference(self, other: "DetectorConfig") -> str | None:
        """None where ``self`` and ``other`` extract the same features, else the first difference in words
        ("max_boxes 100 vs 36"). Compared: the backend, its fields of :data:`_FIELDS_BY_BACKEND` (a config file
        by :func:`config_file_identity`) and the weights: by sha256 where both know it, else by file name."""
        if self.backend != other.backend:
            return f"backend {self.backend} vs {other.backend}"
        for name in _FIELDS_BY_BACKEND[self.backend]:
            a, b = getattr(self, name), getattr(other, name)
            if name == "config_file":
                a, b = config_file_identity(a), config_file_identity(b)
            if a != b:
                return f"{name} {a!r} vs {b!r}"
        mine, theirs = Path(self.weights).name, Path(other.weights).name
        if self.weights_sha256 and other.weights_sha256:
            if self.weights_sha256 != other.weights_sha256:
                return (f"weights sha256 {self.weights_sha256[:12]}... ({mine}) vs {other.weights_sha256[:12]}... "
                        f"({theirs})")
        elif mine != theirs:
            return f"weights file {mine or 'the default'!r} vs {theirs or 'the default'!r}"
        return None

    def fingerprint(self) -> str:
        """10 hex digits naming what this config extracts: the backend, its fields that change the numbers and
        :meth:`weights_identity` (no directory, no vocabulary file)."""
        values = {"backend": self.backend, "weights": self.weights_identity()}
        for name in _FIELDS_BY_BACKEND[self.backend]:
            value = getattr(self, name)
            values[name] = config_file_identity(value) if name == "config_file" else value
        values = {k: v for k, v in values.items() if v not in ("", {})}
        return hashlib.sha1(json.dumps(values, sort_keys=True).encode()).hexdigest()[:10]


#: Detectors by name, for ``tools/extract_regions.py --extracted-with NAME`` (what made imported features) and
#: the families' records. ``butd-vg``: bottom-up attention's Caffe ResNet-101 Faster R-CNN on Visual Genome with
#: attributes (py-bottom-up-attention's ``faster_rcnn_from_caffe_attr.pkl``, sha256 not published), 10-100 boxes
#: at confidence >= 0.2: the features of UNITER and LXMERT (Anderson et al. 2018; BUTD-UNITER-NLVR2
#: ``tools/generate_npz.py``).
NAMED_DETECTORS: dict[str, DetectorConfig] = {
    "butd-vg": DetectorConfig(backend="detectron2", config_file="butd-vg", weights="faster_rcnn_from_caffe_attr.pkl",
                              min_boxes=10, max_boxes=100, score_threshold=0.2),
}


def named_detector(spec: str) -> DetectorConfig:
    """The detector ``spec`` names: a key of :data:`NAMED_DETECTORS`, or a YAML/JSON file of
    :class:`DetectorConfig` fields (as a run config's ``detector`` section; a whole run config, or a
    ``detector.json``, is read from its ``detector`` / ``config`` entry).

    Raises:
        ValueError: neither a name nor a readable file of known fields (the names and the fix said).
    """
    if spec in NAMED_DETECTORS:
        return NAMED_DETECTORS[spec]
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ValueError(f"{spec!r} is neither a known detector ({', '.join(NAMED_DETECTORS)}) nor a file; pass a "
                         "name or a YAML file of detector fields (backend, config_file, weights, ...)")
    values = read_yaml(path, "detector config",
                       "give a YAML file of detector fields (backend, config_file, weights, ...)")
    for section in ("detector", "config"):
        if isinstance(values, dict) and isinstance(values.get(section), dict):
            values = values[section]
    if not isinstance(values, dict):
        raise ValueError(f"{path} holds no mapping of detector fields (backend, config_file, weights, ...)")
    unknown = sorted(set(values) - {f.name for f in fields(DetectorConfig)})
    if unknown:
        raise ValueError(f"{path}: unknown detector fields {', '.join(unknown)}; the fields are those of a run "
                         "config's detector section")
    return DetectorConfig(**values)


__all__ = ["DetectorConfig", "BACKENDS", "NAMED_DETECTORS", "named_detector", "file_sha256", "config_file_identity",
           "BUTD_VG_CONFIG_FILE"]
