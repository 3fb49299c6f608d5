"""The Caffe / MSRA ResNet (He et al. 2016) as Faster R-CNN's C4 models use it: the stride of a stage's first block
in its 1x1 convolution (``stride_in_1x1``), the body up to res4 (stride 16) and res5 as a separate stage (the RoI
head). VL-BERT's e2e backbone (jackroos/VL-BERT at 4373674, ``common/backbone/resnet/resnet.py``) and BUTD's Visual
Genome detector (py-bottom-up-attention's ``faster_rcnn_R_101_C4_attr_caffemaxpool.yaml``: the same blocks, Caffe's
stem max pool) are both built from it. Parameter names are torchvision's (``conv1``, ``bn1``, ``layer1.0.conv1``,
``downsample.0``), which VL-BERT's checkpoints use.

Normalisation is ``nn.BatchNorm2d``; in eval mode it is ``F.batch_norm`` with the running statistics, which is what
detectron2's ``FrozenBatchNorm2d`` computes when no gradient is needed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CaffeBottleneck(nn.Module):
    """ResNet bottleneck with the stride in the first 1x1 convolution (Caffe / MSRA ResNet, VL-BERT's and
    detectron2's ``stride_in_1x1``) and an optional dilation of the 3x3; a projection shortcut (``downsample``:
    1x1 convolution + BN) where the stride or the channel count changes.

    Args:
        inplanes: input channels. planes: the bottleneck's channels (output: ``4 * planes``).
        stride: of the block (1 or 2). dilation: of the 3x3 convolution (its padding too).
        stride_in_1x1: the stride in the first 1x1 convolution (Caffe) rather than the 3x3 (torchvision).
    """

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, dilation: int = 1, stride_in_1x1: bool = True):
        super().__init__()
        s1, s3 = (stride, 1) if stride_in_1x1 else (1, stride)
        self.conv1 = nn.Conv2d(inplanes, planes, 1, stride=s1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=s3, padding=dilation, dilation=dilation, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes * 4:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes * 4, 1, stride=stride, bias=False), nn.BatchNorm2d(planes * 4)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """float [N, inplanes, h, w] -> [N, 4 * planes, h / stride, w / stride]."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (self.downsample(x) if self.downsample is not None else x))


def caffe_stage(inplanes: int, planes: int, blocks: int, stride: int, dilation: int = 1) -> nn.Sequential:
    """One ResNet stage of :class:`CaffeBottleneck` (VL-BERT ``ResNet._make_layer``, detectron2
    ``ResNet.make_stage``: only the first block strides; every block has the stage's dilation)."""
    first = CaffeBottleneck(inplanes, planes, stride, dilation)
    return nn.Sequential(first, *(CaffeBottleneck(planes * 4, planes, 1, dilation) for _ in range(blocks - 1)))


class CaffeMaxPool(nn.Module):
    """Caffe's stem pooling: max pool 3x3, stride 2, no padding, ceil mode (PyTorch ResNets pad by 1 instead: the
    two differ in output size for some inputs and in values at the border). py-bottom-up-attention's
    ``caffemaxpool`` configs use it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """float [N, C, h, w] -> [N, C, ceil((h - 3) / 2) + 1, ceil((w - 3) / 2) + 1]."""
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=0, ceil_mode=True)


class CaffeResNetC4(nn.Module):
    """conv1 (7x7/2) + BN + ReLU + max-pool (3x3/2), then res2-res4 (``layer1``-``layer3``): float [B, 3, H, W] ->
    C4 [B, 4 * 4 * width, ~H/16, ~W/16] (VL-BERT ``resnet101(expose_stages=[4], stride_in_1x1=True)``'s ``body4``;
    detectron2's ``build_resnet_backbone`` with ``OUT_FEATURES: [res4]``).

    Args:
        layers: blocks of res2, res3, res4 ((3, 4, 23) = ResNet-101, (3, 4, 6) = ResNet-50).
        stem_channels: conv1's output channels (64).
        width: res2's bottleneck channels (64; res3: 2x, res4: 4x; each stage's output is 4x its bottleneck).
        caffe_max_pool: the stem's pool as Caffe's (:class:`CaffeMaxPool`, BUTD) instead of PyTorch's padded one
            (VL-BERT).
    """

    def __init__(self, layers=(3, 4, 23), stem_channels: int = 64, width: int = 64, caffe_max_pool: bool = False):
        super().__init__()
        self.conv1 = nn.Conv2d(3, stem_channels, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(stem_channels)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = CaffeMaxPool() if caffe_max_pool else nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = caffe_stage(stem_channels, width, layers[0], 1)
        self.layer2 = caffe_stage(width * 4, width * 2, layers[1], 2)
        self.layer3 = caffe_stage(width * 8, width * 4, layers[2], 2)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """float [B, 3, H, W] normalised as the weights expect -> res4 [B, 16 * width, h, w] (stride 16)."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(images))))
        return self.layer3(self.layer2(self.layer1(x)))

    def stages(self) -> list[list[nn.Parameter]]:
        """Parameters per stage in order (VL-BERT's numbering: 1 = the stem, 2 = res2, ...)."""
        return [[*self.conv1.parameters(), *self.bn1.parameters()]] + [
            list(m.parameters()) for m in (self.layer1, self.layer2, self.layer3)
        ]


__all__ = ["CaffeBottleneck", "caffe_stage", "CaffeMaxPool", "CaffeResNetC4"]
