"""The region source record: what made a model's region features (the detector's configuration with its weights'
sha256, its fingerprint, the extractor's name the regions carry) and their size. Features of another extractor than
the one a model was trained on are this field's classic silent error; this record is how fine-tuning and inference
tell them apart (:meth:`RegionSource.difference`), and the one place that reads it from a region store
(:meth:`RegionSource.from_store`) and from a saved processor (:meth:`RegionSource.from_record`)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from vlbert.detectors.config import DetectorConfig
from vlbert.detectors.shards import read_detector_info


@dataclass(frozen=True)
class RegionSource:
    """What made a model's region features.

    Attributes:
        fingerprint: the detector's fingerprint (10 hex digits, :meth:`~vlbert.detectors.config.DetectorConfig.fingerprint`)
            or None where unknown (features imported without saying what extracted them).
        config: the :class:`~vlbert.detectors.config.DetectorConfig` fields (``weights_sha256`` included where the weights
            file was hashed) as saved, or None where unknown.
        extractor: the extractor's name as its regions carry it (``Regions.detector``), "" where none.
        feature_dim: the region feature size D of ``region_features`` [B, R, D], or None where not recorded.
    """

    fingerprint: str | None = None
    config: dict | None = None
    extractor: str = ""
    feature_dim: int | None = None

    @classmethod
    def from_store(cls, store, detector: DetectorConfig | None = None) -> "RegionSource":
        """The source of the regions of ``store`` (a :class:`~vlbert.detectors.store.RegionStore`, or a
        :class:`~vlbert.detectors.store.MergedRegions` of them): the shard directory's ``detector.json`` decides when it
        has one (``vlbert extract`` writes it, with the weights' sha256; for imported features, the
        detector its ``--extracted-with`` named); else ``detector`` (the run's ``detector`` section where it
        extracted the regions: the cached easy-VQA images; its weights file is hashed); imported features that
        named no detector have neither: fingerprint and config are None (unknown). ``feature_dim``: the first
        image's.

        Raises:
            ValueError: ``detector``'s recorded sha256 is not its weights file's.
        """
        stores = list(store.stores.values()) if hasattr(store, "stores") else [store]
        info = read_detector_info(stores[0].directory) if hasattr(stores[0], "directory") else None
        first = next(iter(stores[0].values()), None)
        extractor = first.detector if first is not None else ""
        dim = first.feature_dim if first is not None else None
        if info and info.get("fingerprint"):
            return cls(info["fingerprint"], info.get("config"), extractor, dim)
        if detector is not None:
            detector = detector.identified()
            return cls(detector.fingerprint(), asdict(detector), extractor, dim)
        return cls(None, None, extractor, dim)

    @classmethod
    def from_record(cls, entry: dict | None, feature_dim: int | None = None) -> "RegionSource":
        """The inverse of :meth:`record`: a saved processor's ``detector`` entry (``{"fingerprint", "config",
        "extractor"}``; None or {} = unknown provenance) and its ``region_feature_dim``."""
        entry = entry or {}
        return cls(entry.get("fingerprint"), entry.get("config"), entry.get("extractor") or "", feature_dim)

    @classmethod
    def of_detector(cls, detector: DetectorConfig | None, feature_dim: int | None = None) -> "RegionSource":
        """The source of regions extracted with ``detector`` (a model in memory told its detector; None:
        unknown), without hashing its weights file; the extractor's name is left unknown ("": regions given
        ready-made are not checked by name, only by feature size)."""
        if detector is None:
            return cls(feature_dim=feature_dim)
        return cls(detector.fingerprint(), asdict(detector), "", feature_dim)

    def record(self) -> dict[str, Any]:
        """The ``detector`` entry a processor saves: ``{"fingerprint", "config", "extractor"}`` (the feature size is
        saved beside it, as ``region_feature_dim``)."""
        return {"fingerprint": self.fingerprint, "config": self.config, "extractor": self.extractor}

    @property
    def known(self) -> bool:
        """Whether anything says which detector made the features (a config or a fingerprint)."""
        return bool(self.config or self.fingerprint)

    def detector(self) -> DetectorConfig | None:
        """The recorded :class:`~vlbert.detectors.config.DetectorConfig`, or None where none is recorded (imported
        features). Raises ValueError for a record this version cannot read."""
        return DetectorConfig.from_record(self.config) if self.config else None

    def difference(self, other: "RegionSource") -> str | None:
        """None where ``other`` describes the same features, else what differs in words: by
        :meth:`~vlbert.detectors.config.DetectorConfig.difference` where both record a detector config (the weights by
        sha256 where both know it, else by file name), else the same fingerprint where either has one, else the
        same extractor name where both have one; unknown provenance on both sides matches."""
        if self.config and other.config:
            return DetectorConfig.from_record(self.config).difference(DetectorConfig.from_record(other.config))
        if self.fingerprint or other.fingerprint:
            same = self.fingerprint == other.fingerprint
            return None if same else f"detector {self.fingerprint} vs {other.fingerprint}"
        if self.extractor and other.extractor and self.extractor != other.extractor:
            return f"extractor {self.extractor} vs {other.extractor}"
        return None


def choose_detector(
    source: RegionSource,
    detector: DetectorConfig | None = None,
    allow_other_detector: bool = False,
    detector_weights: str | os.PathLike | None = None,
) -> DetectorConfig | None:
    """The detector that extracts regions for a processor whose regions came from ``source``
    (:meth:`~vlbert.processing.VLProcessor.use_detector`): the record's own, reading its weights from
    ``detector_weights`` where given; or ``detector`` when it extracts the same features or ``allow_other_detector``
    is set; None where neither exists (imported features, no ``detector`` given).

    Raises:
        ValueError: ``detector`` differs from the record's (both fingerprints named, and what differs) and
            ``allow_other_detector`` is False; ``detector_weights`` come with ``detector`` or with a record that names
            no detector, or are other weights.
        FileNotFoundError: ``detector_weights`` does not exist.
    """
    own = source.detector()
    if detector_weights is not None:
        if detector is not None:
            raise ValueError(
                "detector_weights locates the run's own detector's weights; a detector of your own "
                "names its weights itself (its weights field): pass one of the two"
            )
        if own is None:
            raise ValueError(
                f"the run's regions were imported from precomputed features ({source.extractor}) and name no "
                "detector, so detector_weights has nothing to apply to: pass the images' Regions"
            )
        return own.with_weights(detector_weights)
    if detector is None:
        return own
    why = own.difference(detector) if own is not None else "the run records no detector"
    if why is not None and not allow_other_detector:
        raise ValueError(
            f"the run was trained on regions of detector {source.fingerprint} ({source.extractor}), but the "
            f"given detector is {detector.fingerprint()} ({detector.backend}): {why}; features of another "
            "extractor silently degrade every prediction: leave detector unset to use the run's own, or pass "
            "allow_other_detector=True (--allow-other-detector) to override"
        )
    return detector


__all__ = ["RegionSource", "choose_detector"]
