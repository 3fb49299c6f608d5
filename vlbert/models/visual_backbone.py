"""A region pathway that learns from pixels: a CNN runs inside the model on the batch's images, RoIAlign pools each
given box from its feature map, and a head turns the pooled grid into the region feature, so gradients reach the
backbone (VL-BERT's "e2e"; Su et al., ICLR 2020, section 3.3; jackroos/VL-BERT at 4373674, ``common/fast_rcnn.py``
``FastRCNN``, ``common/backbone/resnet/resnet.py``).

``config.visual_backbone`` chooses it (:class:`RegionFeatureExtractor`); its fields (their types and ranges:
:class:`vlbert.config.VisualBackboneConfig`):

* ``kind``: "caffe-resnet" (VL-BERT's: Caffe-style ResNet up to C4, stride 16, strides in the 1x1 convolutions,
  then the res5 stage as the RoI head, dilated, 14x14 RoIAlign, average pooled: 2048-d), "torchvision-resnet"
  (torchvision's ResNet, the same C4 + res5 split) or "timm" (any timm model with ``features_only``: RoIAlign on the
  last feature level, average pooled, no head);
* ``layers`` (caffe-resnet: blocks of res2-res4, [3, 4, 23] = ResNet-101), ``depth`` (torchvision: 18/34/50/101),
  ``model`` (timm name), ``roi_size`` (14), ``sampling_ratio`` (1), ``aligned`` (False: VL-BERT's RoIAlign);
* ``frozen_stages`` ([1, 2]: the stem and res2 / the first timm level, as VL-BERT's ``IMAGE_FROZEN_BACKBONE_STAGES``)
  and ``frozen_bn`` (True: BatchNorm parameters frozen and its statistics never updated, ``IMAGE_FROZEN_BN``);
* ``mask_pixels`` (True: a masked region's pixels are zeroed before the CNN, VL-BERT's ``MASK_RAW_PIXELS``),
  ``checkpointing`` (False: recompute the backbone's activations in the backward), ``learning_rate`` (None: the
  run's; else the backbone's own parameter group), ``pretrained`` (False: random weights, to be loaded from a
  checkpoint; True: torchvision's / timm's downloadable ImageNet weights, online only), ``weights`` (timm only, None:
  none; a timm state dict file (.safetensors or weights-only torch), or "packaged": the offline ImageNet
  EfficientNet-Lite0 the easy-VQA detector uses (:func:`vlbert.detectors.backbone.load_efficientnet_lite0`); read when the
  model is built, then replaced by a checkpoint's own weights where the model loads one).

The torchvision head is its ``layer4`` as built (stride 2, not dilated: a 14x14 RoI becomes 7x7 before pooling).

Images are float [B, 3, H, W], already normalised as the backbone was trained (VL-BERT: BGR, means subtracted,
short side 600, long side <= 1000: :data:`vlbert.processing.images.PREPROCESSING`, which the recipes and pipelines apply); ``image_sizes`` int [B, 2] (height, width) says where each image lies in a padded
batch (top-left); boxes are normalised (x1, y1, x2, y2) of that image.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch import nn

from vlbert.common.dependencies import require
from vlbert.config import VisualBackboneConfig
from vlbert.detectors.backbone import load_efficientnet_lite0, read_state_dict
from vlbert.detectors.caffe_resnet import CaffeResNetC4, caffe_stage
from vlbert.models.pretrained import OwnLearningRate

#: The fields' defaults (their types and ranges: :class:`vlbert.config.VisualBackboneConfig`).
DEFAULTS = VisualBackboneConfig.options(None)


class TimmLevels(nn.Module):
    """A timm ``features_only`` model whose last level is the RoI feature map; ``stages`` split its parameters by
    feature level (level k's stage holds the modules up to that level's output)."""

    def __init__(self, name: str, pretrained: bool = False, weights: str | None = None):
        super().__init__()
        timm = require("timm", "the timm visual backbone", "pip install timm")
        self.net = timm.create_model(name, features_only=True, pretrained=pretrained)
        self.stride = self.net.feature_info.reduction()[-1]
        self.channels = self.net.feature_info.channels()[-1]
        if weights:
            self.load_weights(name, weights)

    def load_weights(self, name: str, weights: str) -> None:
        """Load the backbone's tensors from ``weights`` (see the module docstring), every ``features_only`` tensor
        required (the classifier's are skipped). Skipped on the meta device (nothing to load into).

        Raises:
            ValueError: "packaged" for another model than efficientnet_lite0, or a file that lacks tensors of the
                model or has them in other shapes (the first named).
            FileNotFoundError: no such file.
        """
        if next(self.net.parameters()).is_meta:
            return
        if weights == "packaged" and name != "efficientnet_lite0":
            raise ValueError(
                f"config.visual_backbone.weights='packaged' is the ImageNet efficientnet_lite0; model is "
                f"{name!r}: pass a weights file of {name}"
            )
        source = (
            load_efficientnet_lite0().state_dict()
            if weights == "packaged"
            else read_state_dict(weights, "model.visual_backbone.weights")
        )
        target = self.net.state_dict()
        wrong = [k for k in target if k not in source or source[k].shape != target[k].shape]
        if wrong:
            raise ValueError(
                f"config.visual_backbone.weights {weights} does not fit timm's {name}: {wrong[0]} is "
                f"missing or of another shape ({len(wrong)} such tensors); pass weights of {name}"
            )
        self.net.load_state_dict({k: source[k] for k in target})

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """float [B, 3, H, W] -> the last level [B, channels, H / stride, W / stride]."""
        return self.net(images)[-1]

    def stages(self) -> list[list[nn.Parameter]]:
        """Parameters per feature level, in order: a parameter belongs to the level whose module holds it, or
        else to the first level computed after it (a stem before the first level's module)."""
        levels = self.net.feature_info.module_name()
        order = {name: i for i, (name, _) in enumerate(self.net.named_modules())}
        groups: list[list[nn.Parameter]] = [[] for _ in levels]
        for name, p in self.net.named_parameters():
            owner = name.rsplit(".", 1)[0]
            inside = [i for i, level in enumerate(levels) if owner == level or owner.startswith(level + ".")]
            after = [i for i, level in enumerate(levels) if order[level] >= order[owner]]
            groups[(inside or after or [len(levels) - 1])[0]].append(p)
        return groups


def _torchvision_c4(depth: int, pretrained: bool) -> tuple[nn.Module, nn.Module]:
    from torchvision.models import resnet as torchvision_resnet  # here: torchvision.ops imports torch._dynamo (2 s)

    net = getattr(torchvision_resnet, f"resnet{depth}")(weights="DEFAULT" if pretrained else None)
    body = nn.Sequential()
    for name in ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3"):
        body.add_module(name, getattr(net, name))
    return body, net.layer4


class RegionFeatureExtractor(OwnLearningRate, nn.Module):
    """Images + boxes -> region features [B, R, D], trainable (see the module docstring for the options).

    Args of forward:
        images: float [B, 3, H, W], normalised as the backbone expects.
        region_boxes: float [B, R, 4], (x1, y1, x2, y2) normalised by each image's own width and height.
        region_mask: [B, R], 1 = real region (padding gets a zero feature and costs no RoI computation).
        image_sizes: int64 [B, 2] (height, width) of each image inside ``images`` (default: the whole tensor).
        masked_regions: bool [B, R]: with ``mask_pixels`` their pixels are zeroed (int(x1)..int(x2), inclusive,
            as VL-BERT's dataset does) before the backbone runs.
    Returns:
        float [B, R, feature_dim].
    Raises:
        ValueError: an unknown option, a value of the wrong type or out of range
            (:class:`vlbert.config.VisualBackboneConfig`), a frozen stage the backbone does not have.
    """

    def __init__(self, options: dict):
        super().__init__()
        # torchvision's RoIAlign, imported with the first backbone built: torchvision.ops imports torch._dynamo
        # (2 s), which ``import vlbert`` need not pay
        from torchvision.ops import roi_align

        self.roi_align = roi_align
        self.options = VisualBackboneConfig.options(options)  # types and ranges checked, defaults filled
        kind = self.options["kind"]
        if kind == "caffe-resnet":
            self.body, self.stride = CaffeResNetC4(self.options["layers"]), 16
            self.head = caffe_stage(1024, 512, 3, stride=1, dilation=2)
            self.feature_dim, stages = 2048, self.body.stages() + [self.head]
        elif kind == "torchvision-resnet":
            self.body, self.head = _torchvision_c4(self.options["depth"], self.options["pretrained"])
            self.stride, self.feature_dim = 16, _out_channels(self.head)
            stages = [
                [*self.body.conv1.parameters(), *self.body.bn1.parameters()],
                self.body.layer1,
                self.body.layer2,
                self.body.layer3,
                self.head,
            ]
        elif kind == "timm":
            self.body = TimmLevels(self.options["model"], self.options["pretrained"], self.options["weights"])
            self.head = None
            self.stride, self.feature_dim, stages = self.body.stride, self.body.channels, self.body.stages()
        else:  # (VisualBackboneConfig's kind is one of the three)
            raise AssertionError(kind)
        self._stage_params = [list(s.parameters()) if isinstance(s, nn.Module) else s for s in stages]
        self.freeze(self.options["frozen_stages"], self.options["frozen_bn"])

    def freeze(self, stages, frozen_bn: bool) -> None:
        """Stop gradients into the listed stages (1-based: 1 = the stem) and, with ``frozen_bn``, into every
        BatchNorm (whose running statistics :meth:`train` then keeps fixed too)."""
        for stage in stages:
            if not 1 <= stage <= len(self._stage_params):
                raise ValueError(
                    f"config.visual_backbone.frozen_stages: {stage} is not a stage in 1..{len(self._stage_params)}"
                )
            for p in self._stage_params[stage - 1]:
                p.requires_grad_(False)
        self.frozen_bn = frozen_bn
        if frozen_bn:
            for m in self.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    for p in m.parameters():
                        p.requires_grad_(False)

    def train(self, mode: bool = True):
        """As ``nn.Module.train``, but frozen BatchNorms stay in eval mode (VL-BERT ``bn_eval``)."""
        super().train(mode)
        if self.frozen_bn:
            for m in self.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.eval()
        return self

    @property
    def learning_rate(self) -> float | None:
        """The backbone's own learning rate (its parameter group's), or None for the run's."""
        return self.options["learning_rate"]

    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        """The RoI feature map [B, C, H / stride, W / stride] (recomputed in the backward with ``checkpointing``)."""
        if self.options["checkpointing"] and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(self._body, images, use_reentrant=False)
        return self._body(images)

    def _body(self, images):
        return self.body(images)

    def forward(self, images, region_boxes, region_mask=None, image_sizes=None, masked_regions=None):
        b, r = region_boxes.shape[:2]
        if image_sizes is None:
            image_sizes = torch.tensor(images.shape[-2:], device=images.device).expand(b, 2)
        scale = image_sizes.flip(-1).to(region_boxes.dtype).repeat(1, 2)[:, None]  # (w, h, w, h)
        pixels = region_boxes * scale
        if self.options["mask_pixels"] and masked_regions is not None:
            images = mask_pixels(images, pixels, masked_regions)
        real = (
            region_mask.bool() if region_mask is not None else torch.ones(b, r, dtype=torch.bool, device=images.device)
        ).flatten()
        index = real.nonzero().squeeze(1)
        rois = torch.cat([(index // r).to(pixels.dtype)[:, None], pixels.flatten(0, 1)[index]], 1)
        fmap = self.feature_map(images)
        size = self.options["roi_size"]
        pooled = self.roi_align(
            fmap.float(),
            rois.float(),
            (size, size),
            1.0 / self.stride,
            self.options["sampling_ratio"],
            self.options["aligned"],
        )
        if self.head is not None:
            pooled = self.head(pooled.to(fmap.dtype))
        features = pooled.mean((2, 3))
        out = features.new_zeros(b * r, features.shape[1])
        return out.index_copy(0, index, features).view(b, r, -1)


def _out_channels(stage: nn.Sequential) -> int:
    last = stage[-1]
    return (last.conv3 if hasattr(last, "conv3") else last.conv2).out_channels


def mask_pixels(images: torch.Tensor, pixel_boxes: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """``images`` [B, C, H, W] with every pixel inside a masked box set to 0 (after normalisation, so the mean
    colour): rows int(y1)..int(y2) and columns int(x1)..int(x2), inclusive (VL-BERT ``conceptual_captions.py``).
    pixel_boxes float [B, R, 4] in pixels; masked bool [B, R]. Returns a new tensor."""
    h, w = images.shape[-2:]
    ys = torch.arange(h, device=images.device)
    xs = torch.arange(w, device=images.device)
    lo, hi = pixel_boxes.floor().long()[..., :2], pixel_boxes.floor().long()[..., 2:]
    rows = ((ys >= lo[..., 1:2]) & (ys <= hi[..., 1:2]) & masked[..., None]).float()  # [B, R, H]
    cols = ((xs >= lo[..., 0:1]) & (xs <= hi[..., 0:1])).float()  # [B, R, W]
    hidden = torch.bmm(rows.transpose(1, 2), cols) > 0  # [B, H, W]
    return images.masked_fill(hidden[:, None], 0.0)


__all__ = ["RegionFeatureExtractor", "mask_pixels", "DEFAULTS"]
