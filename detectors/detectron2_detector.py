"""The detectron2 backend (e.g. the Visual Genome bottom-up-attention model): not written yet."""

from __future__ import annotations


class Detectron2RegionDetector:
    """Placeholder for the detectron2 backend (e.g. the Visual Genome bottom-up-attention model).

    detectron2 is not on PyPI; when it is installed this backend can be completed around
    ``detectron2.engine.DefaultPredictor``. Without it, constructing this class raises a clear error.

    Raises:
        ModuleNotFoundError: detectron2 is not installed (the message says how to install it).
        NotImplementedError: detectron2 is installed; this backend is not written yet.
    """

    def __init__(self, config_file: str, weights: str, device: str = "cpu"):
        try:
            import detectron2  # noqa: F401
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(
                "the detectron2 backend needs detectron2, which is not on PyPI: install it from source "
                "(pip install 'git+https://github.com/facebookresearch/detectron2.git'), or use the torchvision or "
                "timm backends (detectors.TorchvisionRegionDetector, detectors.BackboneRegionExtractor)") from e
        raise NotImplementedError("the detectron2 backend is not implemented yet; use the torchvision or timm backend")


__all__ = ["Detectron2RegionDetector"]
