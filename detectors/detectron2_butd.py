"""The bottom-up-attention Visual Genome detector's parts that detectron2 lacks (Anderson et al. 2018; the
detectron2 port is py-bottom-up-attention): Caffe's stem max pool, and the attribute head of the C4 box head.

Importing this module registers, in detectron2's registries:
  * backbone ``build_butd_resnet_backbone``: detectron2's ResNet with :class:`CaffeMaxPoolStem`;
  * ROI heads ``ButdAttributeRes5ROIHeads``: detectron2's ``Res5ROIHeads`` plus :class:`AttributePredictor` when
    ``MODEL.ATTRIBUTE_ON``.
:func:`add_butd_config` adds the config keys these read. The config file of the whole model is
:data:`BUTD_VG_CONFIG` (``detectors/configs/butd-vg-R101-C4-attr.yaml``). Needs detectron2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from detectron2.config import CfgNode, configurable
from detectron2.modeling import BACKBONE_REGISTRY, ROI_HEADS_REGISTRY
from detectron2.modeling.backbone.resnet import BasicStem, build_resnet_backbone
from detectron2.modeling.roi_heads import Res5ROIHeads
from vlbert.detectors.butd_model import AttributePredictor
from vlbert.detectors.files import BUTD_VG_CONFIG_FILE

BUTD_VG_CONFIG = BUTD_VG_CONFIG_FILE


def add_butd_config(cfg: CfgNode) -> CfgNode:
    """Add ``MODEL.ATTRIBUTE_ON`` (False) and ``MODEL.ROI_ATTRIBUTE_HEAD`` (NUM_ATTRIBUTES 400, CLASS_EMBED_DIM
    256, FC_DIM 512) to a detectron2 config, in place; returns it. Harmless for configs that do not use them."""
    cfg.MODEL.ATTRIBUTE_ON = False
    cfg.MODEL.ROI_ATTRIBUTE_HEAD = CfgNode({"NUM_ATTRIBUTES": 400, "CLASS_EMBED_DIM": 256, "FC_DIM": 512})
    return cfg


class CaffeMaxPoolStem(BasicStem):
    """detectron2's ResNet stem with Caffe's pooling: 7x7/2 conv, ReLU, then max pool 3x3/2 with no padding and
    ceil mode (detectron2 pads by 1 instead; the two differ in output size for some inputs and in values at the
    border). Parameters are named as ``BasicStem``'s (``stem.conv1``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu_(self.conv1(x))
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=0, ceil_mode=True)


@BACKBONE_REGISTRY.register()
def build_butd_resnet_backbone(cfg: CfgNode, input_shape):
    """detectron2's ``build_resnet_backbone`` with the stem replaced by :class:`CaffeMaxPoolStem`."""
    backbone = build_resnet_backbone(cfg, input_shape)
    backbone.stem = CaffeMaxPoolStem(
        in_channels=input_shape.channels, out_channels=cfg.MODEL.RESNETS.STEM_OUT_CHANNELS, norm=cfg.MODEL.RESNETS.NORM
    )
    return backbone


@ROI_HEADS_REGISTRY.register()
class ButdAttributeRes5ROIHeads(Res5ROIHeads):
    """detectron2's C4 ``Res5ROIHeads`` with :class:`AttributePredictor` as ``attribute_predictor`` (None when
    ``MODEL.ATTRIBUTE_ON`` is False). Detection itself (``forward``) is unchanged; the extractor calls the
    attribute head on the boxes it keeps."""

    @configurable
    def __init__(self, *, attribute_predictor: AttributePredictor | None = None, **kwargs):
        super().__init__(**kwargs)
        self.attribute_predictor = attribute_predictor

    @classmethod
    def from_config(cls, cfg: CfgNode, input_shape):
        ret = super().from_config(cfg, input_shape)
        if cfg.MODEL.ATTRIBUTE_ON:
            head = cfg.MODEL.ROI_ATTRIBUTE_HEAD
            feature_dim = cfg.MODEL.RESNETS.RES2_OUT_CHANNELS * 8
            ret["attribute_predictor"] = AttributePredictor(
                feature_dim, cfg.MODEL.ROI_HEADS.NUM_CLASSES, head.NUM_ATTRIBUTES, head.CLASS_EMBED_DIM, head.FC_DIM
            )
        return ret


__all__ = [
    "BUTD_VG_CONFIG",
    "add_butd_config",
    "CaffeMaxPoolStem",
    "build_butd_resnet_backbone",
    "ButdAttributeRes5ROIHeads",
]
