"""Detection, apart from the processor that is given it: which detector turns images into regions, where its
weights are read, on which device, and whether regions of another detector than the run's are accepted. The
backend is built on first use (loading weights is the slow part). A :class:`~vlbert.processing.VLProcessor` holds
the input rules a model was trained with; a :class:`Detection` is how one machine extracts regions under them
(transformers keeps its image processor's device apart the same way)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from vlbert.detectors.config import DetectorConfig
from vlbert.detectors.extract import extract_regions
from vlbert.detectors.regions import Regions
from vlbert.processing.region_source import RegionSource, choose_detector


class Detection:
    """A detector ready to extract regions on a device.

    Args:
        detector: the detector's configuration (:class:`~vlbert.detectors.config.DetectorConfig`), or None where
            the run's regions were imported from precomputed features (then images must come as Regions).
        device: where the backend runs ("cpu", "cuda", ...).
        allow_other_detector: regions of another extractor than the run's are accepted (at the cost of silently
            worse predictions).
        weights_checked: the weights file was checked against the recorded sha256 already (given by the user);
            otherwise the backend checks it when it is built (:meth:`~vlbert.detectors.config.DetectorConfig.
            identified`).
        imported_from: the extractor's name where ``detector`` is None (messages).
    """

    def __init__(
        self,
        detector: DetectorConfig | None,
        device: str = "cpu",
        allow_other_detector: bool = False,
        weights_checked: bool = False,
        imported_from: str = "",
    ):
        self.detector, self.device = detector, str(device)
        self.allow_other_detector, self.weights_checked = allow_other_detector, weights_checked
        self.imported_from = imported_from
        self._extractor = None

    @classmethod
    def for_source(
        cls,
        source: RegionSource | None,
        detector: DetectorConfig | None = None,
        allow_other_detector: bool = False,
        detector_weights: str | os.PathLike | None = None,
        device: str = "cpu",
    ) -> Detection:
        """The detection for a run whose regions came from ``source``: the record's own detector, reading its
        weights from ``detector_weights`` where given (checked against the recorded sha256); or ``detector`` when it
        extracts the same features or ``allow_other_detector`` is set (:func:`~vlbert.processing.region_source.
        choose_detector`).

        Raises:
            ValueError, FileNotFoundError: from :func:`~vlbert.processing.region_source.choose_detector`.
        """
        source = source or RegionSource()
        chosen = choose_detector(source, detector, allow_other_detector, detector_weights)
        return cls(chosen, device, allow_other_detector, detector_weights is not None, source.extractor)

    @property
    def extractor(self):
        """The detector backend, built on first use.

        Raises:
            ValueError: no detector (imported features). FileNotFoundError: its weights are not on this machine.
        """
        if self._extractor is None:
            if self.detector is None:
                raise ValueError(
                    f"the run's regions were imported from precomputed features ({self.imported_from}), so no "
                    "detector can be rebuilt from it: pass the images' Regions, or a detector with "
                    "allow_other_detector=True"
                )
            weights = Path(self.detector.weights).expanduser()
            if self.detector.weights not in ("", "DEFAULT") and not weights.is_file():
                raise FileNotFoundError(
                    f"the run's detector reads weights {self.detector.weights}, which are not on this machine: pass "
                    f"where you keep {weights.name}: pipeline(run, detector_weights=PATH) (vlbert predict "
                    "--detector-weights PATH)"
                )
            detector = self.detector if self.weights_checked else self.detector.identified()
            self._extractor = detector.build(self.device)
        return self._extractor

    def extract(
        self,
        sources: Sequence[tuple[str, object]],
        boxes: dict[str, np.ndarray] | None = None,
        batch_size: int = 16,
    ) -> list[Regions]:
        """Each ``(id, image)`` source's regions, in order (:func:`~vlbert.detectors.extract.extract_regions`);
        ``boxes``: id -> float32 [N, 4] pixel xyxy boxes to pool instead of detecting (the timm backend), or None.

        Raises:
            ValueError, FileNotFoundError: as :attr:`extractor`; an unreadable image."""
        return list(extract_regions(self.extractor, list(sources), batch_size, boxes=boxes, progress=False))


__all__ = ["Detection"]
