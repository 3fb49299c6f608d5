"""One detector configuration for every place that extracts regions: the ``detector`` section of the VL run
configs, the region cache, and ``vlbert extract`` (whose flags map onto these fields).

A config is the backend's name (a line of :data:`vlbert.detectors.backends.DETECTOR_BACKENDS`), the weights file and its
sha256, and the backend's own options (its dataclass)::

    detector:
      backend: timm
      weights: ""            # "" = the backend's default
      options: {architecture: efficientnet_lite0, input_size: 160, max_proposals: 16}

The flat layout that came before (``detector: {backend: timm, input_size: 160}``, and every ``detector.json``
written before it) reads too: a key of the backend's options outside ``options`` is one of them.

What identifies the features a config extracts (:meth:`DetectorConfig.fingerprint`,
:meth:`DetectorConfig.difference`): the backend, the options fields its table line names, and the weights'
identity, the sha256 of the weights file's content (``weights_sha256``, written at extraction by
:meth:`DetectorConfig.identified`), or where a record has none (a published model's description) the weights
file's name. Never a directory, never a vocabulary file: class and attribute names do not change the features.
docs/regions.md says more.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vlbert.detectors.backends import DEFAULT_BACKEND, DETECTOR_BACKENDS, backend_list, detector_backend
from vlbert.detectors.butd_vg import ButdOptions
from vlbert.detectors.files import file_sha256

from vlbert.common.typed_config import check_value, field_types
from vlbert.common.user_files import read_yaml

#: The keys of a ``detector`` section besides the backend's options.
COMMON_KEYS = ("backend", "weights", "weights_sha256", "options")


def typed_options(options_class: type, values: dict[str, Any], section: str = "detector.options") -> Any:
    """``options_class`` from a mapping of its fields, each value read as its field's annotation says through the
    one typed reading of config values (:func:`vlbert.common.typed_config.check_value`: numbers written as strings
    converted, 1.5 refused for a count); the options' own ``validate`` checks the ranges.

    Raises:
        ValueError: an unknown key (the backend's fields said), or a value not of (or convertible to) its type.
    """
    types = field_types(options_class)
    unknown = sorted(set(values) - set(types))
    if unknown:
        raise ValueError(
            f"unknown detector fields {', '.join(unknown)} in {section}; this backend's options are {', '.join(types)}"
        )
    return options_class(**{key: check_value(value, types[key], f"{section}.{key}") for key, value in values.items()})


@dataclass
class DetectorConfig:
    """How images become regions (YAML section ``detector``; ``vlbert extract`` flags).

    Attributes:
        backend: a key of :data:`vlbert.detectors.backends.DETECTOR_BACKENDS` (``timm``, ``torchvision``, ``detectron2``).
        weights: a weights file; "" = the backend's default (timm: the packaged EfficientNet-Lite0 ImageNet
            weights; torchvision: its COCO weights, downloaded when online).
        weights_sha256: the sha256 (64 hex digits) of the weights file's content; "" = not known (a published
            model's record that knows only the file's name). :meth:`identified` fills it from the file.
        options: the backend's options (its dataclass; a mapping of its fields is converted, None = defaults).
    Raises:
        ValueError: an unknown backend, options of another backend, and the options' own ``validate``.
    """

    backend: str = DEFAULT_BACKEND
    weights: str = ""
    weights_sha256: str = ""
    options: Any = None

    def __post_init__(self) -> None:
        entry = detector_backend(self.backend)
        if self.options is None:
            self.options = entry.options()
        elif isinstance(self.options, dict):
            self.options = typed_options(entry.options, self.options)
        elif not isinstance(self.options, entry.options):
            raise ValueError(
                f"detector.options of the {self.backend} backend are {entry.options.__name__}, got "
                f"{type(self.options).__name__}"
            )
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` for a malformed ``weights_sha256`` or options out of range (their ``validate``)."""
        if self.weights_sha256 and not re.fullmatch(r"[0-9a-f]{64}", self.weights_sha256):
            raise ValueError(
                f"detector.weights_sha256 must be 64 lower-case hex digits (sha256sum's output), got "
                f"{self.weights_sha256!r}"
            )
        self.options.validate(self.weights)

    def build(self, device: str = "cpu"):
        """The extractor this config describes (the backend's build): a callable ``(image, image_id) -> Regions``
        with ``extract_batch(images, image_ids)``.

        Raises:
            ModuleNotFoundError: the backend's package is missing (the message names the install).
            FileNotFoundError: ``weights`` names a file that does not exist.
            ValueError: the backend's refusals (an unknown timm architecture, weights that do not fit...).
        """
        return DETECTOR_BACKENDS[self.backend].build(self.options, self.weights, device)

    def with_options(self, **changes) -> "DetectorConfig":
        """This config with some options changed (``config.with_options(max_boxes=36)``).

        Raises:
            ValueError: a name that is no option of the backend, or a value out of range.
        """
        unknown = sorted(set(changes) - set(DETECTOR_BACKENDS[self.backend].option_names()))
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: no option of the {self.backend} backend")
        return replace(self, options=replace(self.options, **changes))

    @classmethod
    def from_section(cls, values: dict | None, section: str = "detector", strict: bool = True) -> "DetectorConfig":
        """The config of a ``detector`` section or record, in either layout: ``options`` as a mapping, or the
        flat layout of earlier versions (the backend's options beside ``backend``).

        Args:
            values: the section (None = the defaults).
            section: where it comes from, for the messages.
            strict: refuse keys no backend knows and options of another backend (a user's file); False drops
                them (a record written by another version, whose flat layout held every backend's fields).
        Raises:
            ValueError: not a mapping, an unknown backend or key, another backend's option, a key given both flat
                and in ``options`` with different values, or a value of the wrong type.
        """
        if values is None:
            return cls()
        if not isinstance(values, dict) or not isinstance(values.get("options") or {}, dict):
            raise ValueError(
                f"{section} must be a mapping of detector fields (backend, weights, options), got {values!r}"
            )
        backend = values.get("backend", DEFAULT_BACKEND)
        entry = detector_backend(backend)
        mine = entry.option_names()
        options = dict(values.get("options") or {})
        for key in sorted(set(values) - set(COMMON_KEYS)):
            owners = [name for name, other in DETECTOR_BACKENDS.items() if key in other.option_names()]
            if key in mine:
                if key in options and options[key] != values[key]:
                    raise ValueError(f"{section}.{key} and {section}.options.{key} differ; give it once, in options")
                options[key] = values[key]
            elif strict and owners:
                raise ValueError(
                    f"{section}.{key} is an option of the {backend_list(owners)}, not of "
                    f"{backend}; drop it or change {section}.backend"
                )
            elif strict:
                raise ValueError(
                    f"unknown detector fields {key} in {section}; the fields are "
                    f"{', '.join(COMMON_KEYS)} and the backend's options ({', '.join(mine)})"
                )
        if not strict:
            options = {k: v for k, v in options.items() if k in mine}
        common = {k: values[k] for k in ("backend", "weights", "weights_sha256") if k in values}
        return cls(**common, options=typed_options(entry.options, options, f"{section}.options"))

    @classmethod
    def from_record(cls, record: dict) -> "DetectorConfig":
        """The config of a saved record (``detector.json``'s, or a saved processor's ``detector`` entry's ``config``) in either layout,
        fields this version does not know dropped (records written by other versions stay readable).

        Raises:
            ValueError: from :meth:`validate`.
        """
        return cls.from_section(record, "the detector record", strict=False)

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
            raise ValueError(
                f"weights file {path} has sha256 {digest[:12]}..., but the detector records "
                f"{self.weights_sha256[:12]}...: it is not the file the regions were extracted with"
            )
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
            raise FileNotFoundError(
                f"detector weights {path} do not exist; pass the path of the weights file "
                f"({Path(self.weights).name or 'the backend default'})"
            )
        candidate = replace(self, weights=str(path), weights_sha256=file_sha256(path))
        why = self.difference(candidate)
        if why is not None:
            raise ValueError(
                f"detector weights {path} are not the ones the regions were extracted with ({why}); "
                "pass the weights file the run's detector used"
            )
        return candidate

    def canonical(self) -> "DetectorConfig":
        """This config in the terms that name its features: itself, or for a backend whose table line computes
        another's features (``same_features_as``: ``butd`` is detectron2's ``butd-vg``) that backend's config with
        the same weights."""
        entry = DETECTOR_BACKENDS[self.backend]
        if entry.same_features_as is None:
            return self
        backend, options = entry.same_features_as(self.options)
        return DetectorConfig(backend, self.weights, self.weights_sha256, options)

    def feature_values(self, recorded_only: bool = False) -> dict[str, Any]:
        """The options that change the features (the backend's ``feature_fields``, in order), each by its
        identity (a config file by its content); ``recorded_only``: those at their ``unrecorded`` value left out
        (the fingerprint's). Of :meth:`canonical`'s backend."""
        if DETECTOR_BACKENDS[self.backend].same_features_as is not None:
            return self.canonical().feature_values(recorded_only)
        entry = DETECTOR_BACKENDS[self.backend]
        values = {}
        for name in entry.feature_fields:
            value = getattr(self.options, name)
            if recorded_only and name in entry.unrecorded and value == entry.unrecorded[name]:
                continue
            values[name] = entry.identities[name](value) if name in entry.identities else value
        return values

    def difference(self, other: "DetectorConfig") -> str | None:
        """None where ``self`` and ``other`` extract the same features, else the first difference in words
        ("max_boxes 100 vs 36"). Compared: the backend, its :meth:`feature_values` and the weights: by sha256
        where both know it, else by file name; each as :meth:`canonical` names it (``butd`` and detectron2's
        ``butd-vg`` with the same weights extract the same features)."""
        mine_canonical, theirs_canonical = self.canonical(), other.canonical()
        if mine_canonical.backend != theirs_canonical.backend:
            return f"backend {self.backend} vs {other.backend}"
        theirs = other.feature_values()
        for name, value in self.feature_values().items():
            if value != theirs[name]:
                return f"{name} {value!r} vs {theirs[name]!r}"
        mine, theirs = Path(self.weights).name, Path(other.weights).name
        if self.weights_sha256 and other.weights_sha256:
            if self.weights_sha256 != other.weights_sha256:
                return (
                    f"weights sha256 {self.weights_sha256[:12]}... ({mine}) vs {other.weights_sha256[:12]}... "
                    f"({theirs})"
                )
        elif mine != theirs:
            return f"weights file {mine or 'the default'!r} vs {theirs or 'the default'!r}"
        return None

    def fingerprint(self) -> str:
        """10 hex digits naming what this config extracts: the backend, :meth:`feature_values` and
        :meth:`weights_identity` (no directory, no vocabulary file; empty values left out), of :meth:`canonical`."""
        values = {"backend": self.canonical().backend, "weights": self.weights_identity(), **self.feature_values(True)}
        values = {k: v for k, v in values.items() if v not in ("", {})}
        return hashlib.sha1(json.dumps(values, sort_keys=True).encode()).hexdigest()[:10]


#: Detectors by name, for ``vlbert extract --extracted-with NAME`` (what made imported features) and
#: the families' records. ``butd-vg``: bottom-up attention's Caffe ResNet-101 Faster R-CNN on Visual Genome with
#: attributes (py-bottom-up-attention's ``faster_rcnn_from_caffe_attr.pkl``, sha256 not published), 10-100 boxes
#: at confidence >= 0.2: the features of UNITER and LXMERT (Anderson et al. 2018; BUTD-UNITER-NLVR2
#: ``tools/generate_npz.py``).
NAMED_DETECTORS: dict[str, DetectorConfig] = {
    "butd-vg": DetectorConfig(
        backend="butd",
        weights="faster_rcnn_from_caffe_attr.pkl",
        options=ButdOptions(min_boxes=10, max_boxes=100, score_threshold=0.2),
    ),
}


def named_detector(spec: str) -> DetectorConfig:
    """The detector ``spec`` names: a key of :data:`NAMED_DETECTORS`, or a YAML/JSON file of a ``detector``
    section (:meth:`DetectorConfig.from_section`, either layout; a whole run config, or a ``detector.json``, is
    read from its ``detector`` / ``config`` entry).

    Raises:
        ValueError: neither a name nor a readable file of known fields (the names and the fix said).
    """
    if spec in NAMED_DETECTORS:
        return NAMED_DETECTORS[spec]
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ValueError(
            f"{spec!r} is neither a known detector ({', '.join(NAMED_DETECTORS)}) nor a file; pass a "
            "name or a YAML file of a detector section (backend, weights, options)"
        )
    values = read_yaml(path, "detector config", "give a YAML file of a detector section (backend, weights, options)")
    for section in ("detector", "config"):
        if isinstance(values, dict) and isinstance(values.get(section), dict):
            values = values[section]
    if not isinstance(values, dict):
        raise ValueError(f"{path} holds no mapping of detector fields (backend, weights, options)")
    return DetectorConfig.from_section(values, str(path))


__all__ = ["DetectorConfig", "NAMED_DETECTORS", "named_detector", "typed_options", "COMMON_KEYS"]
