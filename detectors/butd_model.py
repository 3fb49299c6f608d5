"""The network of BUTD's Visual Genome detector in plain PyTorch (:mod:`vlbert.detectors.butd_vg` extracts regions
with it): its settings from the config file, its sizes from the weights file, detectron2's anchors and proposal
selection on torchvision's RPN head, box coder, ``roi_pool`` and ``batched_nms``, and the weights' names. Each step
is detectron2's with ``config_file: butd-vg`` (the reasons where torchvision's own parts differ are in
:mod:`vlbert.detectors.butd_vg`).
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from vlbert.detectors.caffe_resnet import CaffeResNetC4, caffe_stage
from vlbert.detectors.detectron2_checkpoint import read_checkpoint
from vlbert.detectors.files import BUTD_VG_CONFIG_FILE

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class ButdSettings:
    """What the BUTD config file says beyond the weights, under detectron2's key names.

    Attributes:
        min_size_test, max_size_test: ``INPUT.MIN_SIZE_TEST`` / ``MAX_SIZE_TEST``, pixels (600, 1000).
        pixel_mean: ``MODEL.PIXEL_MEAN``, BGR, 0-255 (Caffe's ImageNet means); ``pixel_std``: ``MODEL.PIXEL_STD``.
        anchor_sizes, aspect_ratios: ``MODEL.ANCHOR_GENERATOR.SIZES`` / ``ASPECT_RATIOS`` of the one level (pixels;
            height / width).
        pre_nms_topk, post_nms_topk, rpn_nms: ``MODEL.RPN.PRE_NMS_TOPK_TEST`` / ``POST_NMS_TOPK_TEST`` /
            ``NMS_THRESH`` (6000, 300, 0.7).
        pooler_resolution: ``MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION`` (14).
    """

    min_size_test: int = 600
    max_size_test: int = 1000
    pixel_mean: tuple[float, ...] = (102.9801, 115.9465, 122.7717)
    pixel_std: tuple[float, ...] = (1.0, 1.0, 1.0)
    anchor_sizes: tuple[float, ...] = (64, 128, 256, 512)
    aspect_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)
    pre_nms_topk: int = 6000
    post_nms_topk: int = 300
    rpn_nms: float = 0.7
    pooler_resolution: int = 14

    #: detectron2's key of each field.
    KEYS = {
        "min_size_test": "INPUT.MIN_SIZE_TEST",
        "max_size_test": "INPUT.MAX_SIZE_TEST",
        "pixel_mean": "MODEL.PIXEL_MEAN",
        "pixel_std": "MODEL.PIXEL_STD",
        "anchor_sizes": "MODEL.ANCHOR_GENERATOR.SIZES",
        "aspect_ratios": "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS",
        "pre_nms_topk": "MODEL.RPN.PRE_NMS_TOPK_TEST",
        "post_nms_topk": "MODEL.RPN.POST_NMS_TOPK_TEST",
        "rpn_nms": "MODEL.RPN.NMS_THRESH",
        "pooler_resolution": "MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION",
    }

    @classmethod
    def from_config_file(cls, path: str | os.PathLike = BUTD_VG_CONFIG_FILE, overrides: dict | None = None):
        """The settings of a detectron2 YAML file (the packaged ``butd-vg`` one by default), then ``overrides``
        ({"INPUT.MIN_SIZE_TEST": 96, ...}: detectron2's keys, as the detectron2 backend's ``--opts``). Keys the
        file does not set keep detectron2's defaults (this class's).

        Raises:
            ValueError: an override key this detector does not read (the keys it reads said).
        """
        import yaml

        values = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        flat = {}
        for name, key in cls.KEYS.items():
            node = values
            for part in key.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            if node is not None:
                flat[name] = node
        by_key = {key: name for name, key in cls.KEYS.items()}
        for key, value in (overrides or {}).items():
            if key not in by_key:
                raise ValueError(
                    f"the butd detector does not read the detectron2 key {key}; it reads {', '.join(by_key)}"
                )
            flat[by_key[key]] = value
        for name in ("anchor_sizes", "aspect_ratios"):  # one feature level: [[64, 128, 256, 512]]
            if name in flat and flat[name] and isinstance(flat[name][0], (list, tuple)):
                flat[name] = flat[name][0]
        types = {f.name: f.type for f in fields(cls)}
        out = {}
        for name, value in flat.items():
            out[name] = (
                tuple(float(v) for v in value) if "tuple" in str(types[name]) else type(getattr(cls, name))(value)
            )
        return cls(**out)


#: The settings of ``butd-vg`` (the packaged config file): what the ``butd`` backend runs.
BUTD_VG_SETTINGS = ButdSettings.from_config_file()


# ------------------------------------------------------------------------------------------------ the network
class AttributePredictor(nn.Module):
    """BUTD's attribute head: the embedding of the box's predicted object class concatenated with its pooled
    feature, a 512-d ReLU layer, and scores over the attributes plus a last "no attribute" column
    (py-bottom-up-attention's ``AttributePredictor``; parameter names as its checkpoint's).

    Args:
        feature_dim: the pooled box feature (2048 for C4).
        num_classes: object classes (the embedding has one more row, for background, the last index).
        num_attributes: 400 for Visual Genome.
        class_embed_dim, fc_dim: 256 and 512 in BUTD.
    """

    def __init__(
        self, feature_dim: int, num_classes: int, num_attributes: int, class_embed_dim: int = 256, fc_dim: int = 512
    ):
        super().__init__()
        self.cls_embedding = nn.Embedding(num_classes + 1, class_embed_dim)
        self.attr_linear1 = nn.Linear(feature_dim + class_embed_dim, fc_dim)
        self.attr_linear2 = nn.Linear(fc_dim, num_attributes + 1)
        self.num_attributes = num_attributes

    def forward(self, features: torch.Tensor, class_ids: torch.Tensor) -> torch.Tensor:
        """features float [N, D], class_ids int64 [N] (the predicted class) -> logits float [N, A + 1]."""
        hidden = self.attr_linear1(torch.cat([features, self.cls_embedding(class_ids)], dim=-1))
        return self.attr_linear2(F.relu(hidden))


def detectron2_cell_anchors(sizes, aspect_ratios) -> torch.Tensor:
    """float32 [len(sizes) * len(aspect_ratios), 4] anchors centred on (0, 0), (x1, y1, x2, y2) pixels, size-major:
    w = sqrt(size^2 / ratio), h = ratio * w, not rounded (detectron2 ``DefaultAnchorGenerator.generate_cell_anchors``)."""
    anchors = []
    for size in sizes:
        for ratio in aspect_ratios:
            w = math.sqrt(size**2.0 / ratio)
            h = ratio * w
            anchors.append([-w / 2.0, -h / 2.0, w / 2.0, h / 2.0])
    return torch.tensor(anchors, device="cpu")


class DetectronAnchors:
    """The anchors of one feature level as detectron2 places them (offset 0): torchvision's
    ``AnchorGenerator.grid_anchors`` over :func:`detectron2_cell_anchors`, at the network's ``stride``."""

    def __init__(self, sizes, aspect_ratios, stride: int = 16):
        from torchvision.models.detection.anchor_utils import AnchorGenerator

        self.generator = AnchorGenerator(sizes=(tuple(sizes),), aspect_ratios=(tuple(aspect_ratios),))
        self.generator.cell_anchors = [detectron2_cell_anchors(sizes, aspect_ratios)]
        self.stride = stride
        self.num_anchors = len(sizes) * len(aspect_ratios)

    def __call__(self, height: int, width: int, device: torch.device) -> torch.Tensor:
        """float32 [height * width * A, 4]: position-major, anchor-minor (the RPN head's output order)."""
        self.generator.set_cell_anchors(torch.float32, device)
        return self.generator.grid_anchors([[height, width]], [[self.stride, self.stride]])[0]


def rpn_proposals(
    logits: torch.Tensor, proposals: torch.Tensor, image_size: tuple[int, int], settings: ButdSettings
) -> torch.Tensor:
    """One image's proposals after the RPN's selection (detectron2 ``find_top_rpn_proposals`` at test time, one
    level): the ``pre_nms_topk`` highest logits, boxes clipped to the image, non-finite and empty ones dropped, NMS at
    ``rpn_nms`` on the logits, the first ``post_nms_topk``.

    Args:
        logits: float [N] objectness logits. proposals: float [N, 4] decoded boxes, pixels of the resized image.
        image_size: (height, width) of the resized image.
    Returns:
        float [K, 4], highest objectness first.
    """
    from torchvision.ops import batched_nms, clip_boxes_to_image

    scores, order = logits.topk(min(logits.numel(), settings.pre_nms_topk))
    boxes = proposals[order]
    finite = torch.isfinite(boxes).all(dim=1) & torch.isfinite(scores)
    boxes, scores = boxes[finite], scores[finite]
    boxes = clip_boxes_to_image(boxes, image_size)
    nonempty = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    boxes, scores = boxes[nonempty], scores[nonempty]
    keep = batched_nms(boxes.float(), scores, torch.zeros_like(scores, dtype=torch.int64), settings.rpn_nms)
    return boxes[keep[: settings.post_nms_topk]]


@dataclass(frozen=True)
class ButdArchitecture:
    """The network's sizes, read off a weights file (:meth:`of`): blocks of res2-res5, the stem's channels, res2's
    bottleneck width, anchors a position, object classes, and the attribute head's sizes (None: no head)."""

    layers: tuple[int, int, int] = (3, 4, 23)
    res5_blocks: int = 3
    stem_channels: int = 64
    width: int = 64
    num_anchors: int = 12
    num_classes: int = 1600
    attributes: tuple[int, int, int] | None = (400, 256, 512)  # attributes, class embedding, hidden

    @classmethod
    def of(cls, state: dict[str, torch.Tensor]) -> "ButdArchitecture":
        """The sizes of a state dict in this module's names (:func:`plain_state_dict`).

        Raises:
            ValueError: a key the C4 model needs is missing (another architecture: the fix said).
        """
        try:

            def blocks(prefix: str) -> int:
                found = {int(m.group(1)) for k in state if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
                if not found:
                    raise KeyError(prefix + "0")
                return max(found) + 1

            attributes = None
            if "attribute_predictor.attr_linear2.weight" in state:
                attributes = (
                    state["attribute_predictor.attr_linear2.weight"].shape[0] - 1,
                    state["attribute_predictor.cls_embedding.weight"].shape[1],
                    state["attribute_predictor.attr_linear1.weight"].shape[0],
                )
            return cls(
                layers=tuple(blocks(f"backbone.layer{k}.") for k in (1, 2, 3)),
                res5_blocks=blocks("res5."),
                stem_channels=state["backbone.conv1.weight"].shape[0],
                width=state["backbone.layer1.0.conv1.weight"].shape[0],
                num_anchors=state["rpn_head.cls_logits.weight"].shape[0],
                num_classes=state["cls_score.weight"].shape[0] - 1,
                attributes=attributes,
            )
        except KeyError as e:
            raise ValueError(
                f"the weights lack {e.args[0]}: they are not a ResNet C4 Faster R-CNN such as BUTD's "
                "faster_rcnn_from_caffe_attr.pkl (an FPN or another detector runs on the detectron2 backend)"
            ) from None


class ButdVisualGenomeModel(nn.Module):
    """The C4 Faster R-CNN with the attribute head (module docstring), in eval mode only.

    Args:
        architecture: its sizes (:class:`ButdArchitecture`; BUTD's by default).
        settings: the config file's settings (:class:`ButdSettings`).
    Raises:
        ValueError: the anchors of ``settings`` are not as many as the RPN head predicts.
    """

    def __init__(self, architecture: ButdArchitecture = ButdArchitecture(), settings: ButdSettings = BUTD_VG_SETTINGS):
        super().__init__()
        from torchvision.models.detection.rpn import RPNHead

        a, width = architecture, architecture.width
        self.anchors = DetectronAnchors(settings.anchor_sizes, settings.aspect_ratios)
        if self.anchors.num_anchors != a.num_anchors:
            raise ValueError(
                f"the RPN head predicts {a.num_anchors} anchors a position; the config's sizes and aspect ratios "
                f"make {self.anchors.num_anchors}"
            )
        self.architecture, self.settings = a, settings
        self.backbone = CaffeResNetC4(a.layers, a.stem_channels, width, caffe_max_pool=True)
        self.rpn_head = RPNHead(16 * width, a.num_anchors)
        self.res5 = caffe_stage(16 * width, 8 * width, a.res5_blocks, stride=2)
        self.cls_score = nn.Linear(32 * width, a.num_classes + 1)
        self.attribute_predictor = (
            AttributePredictor(32 * width, a.num_classes, *a.attributes) if a.attributes is not None else None
        )
        self.register_buffer("pixel_mean", torch.tensor(settings.pixel_mean).view(-1, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(settings.pixel_std).view(-1, 1, 1), persistent=False)
        self.eval()

    @property
    def feature_dim(self) -> int:
        """The pooled feature's size (2048 for ResNet-101)."""
        return 32 * self.architecture.width

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Proposals and their features for a batch of equally sized images.

        Args:
            images: float32 [B, 3, h, w], BGR 0-255, resized (:func:`resize_shortest_edge`), not normalised.
        Returns:
            proposals: B float [K_i, 4] tensors, (x1, y1, x2, y2) pixels of the resized image, best first;
            features: float [sum K_i, D] mean-pooled res5 of each proposal, in that order;
            class_probs: float [sum K_i, C] softmax over the object classes, background column removed.
        """
        x = (images - self.pixel_mean) / self.pixel_std
        res4 = self.backbone(x)
        (objectness,), (deltas,) = self.rpn_head([res4])
        b, _, h, w = objectness.shape
        logits = objectness.permute(0, 2, 3, 1).flatten(1)  # [B, h*w*A]
        deltas = deltas.view(b, -1, 4, h, w).permute(0, 3, 4, 1, 2).reshape(b, -1, 4)
        anchors = self.anchors(h, w, images.device)
        decoded = self.box_coder.decode_single(deltas.reshape(-1, 4).float(), anchors.repeat(b, 1)).view(b, -1, 4)
        size = tuple(images.shape[-2:])
        proposals = [rpn_proposals(logits[i], decoded[i], size, self.settings) for i in range(b)]
        from torchvision.ops import roi_pool

        resolution = self.settings.pooler_resolution
        pooled = roi_pool(res4, proposals, (resolution, resolution), 1.0 / self.anchors.stride)
        features = self.res5(pooled).mean(dim=(2, 3))
        class_probs = self.cls_score(features).softmax(-1)[:, :-1]  # background is the last column
        return proposals, features, class_probs

    @torch.no_grad()
    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        """res5 over the whole image's res4 map: C5, the detector's grid features (Jiang et al. 2020:
        a C4 detector's res5 applied to the whole map rather than to pooled boxes).

        Args:
            images: float32 [B, 3, h, w], BGR 0-255, resized, not normalised (as :meth:`forward`).
        Returns:
            float [B, 32 * width, ~h / 32, ~w / 32] (2048 channels for ResNet-101).
        """
        return self.res5(self.backbone((images - self.pixel_mean) / self.pixel_std))

    @property
    def box_coder(self):
        """torchvision's ``BoxCoder`` with weights (1, 1, 1, 1) and detectron2's clamp of log(1000 / 16)."""
        from torchvision.models.detection._utils import BoxCoder

        return BoxCoder((1.0, 1.0, 1.0, 1.0), math.log(1000.0 / 16))


# ------------------------------------------------------------------------------------------------ weights
_BLOCK = re.compile(r"^(conv\d)\.(weight|norm\.(.+))$")


def _block_key(rest: str) -> str | None:
    """A detectron2 residual block's parameter name -> this module's (``conv1.norm.weight`` -> ``bn1.weight``)."""
    if rest == "shortcut.weight":
        return "downsample.0.weight"
    if rest.startswith("shortcut.norm."):
        return "downsample.1." + rest[len("shortcut.norm.") :]
    m = _BLOCK.match(rest)
    if m is None:
        return None
    return f"{m.group(1)}.weight" if m.group(3) is None else f"bn{m.group(1)[-1]}.{m.group(3)}"


def plain_state_dict(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A detectron2 state dict of the BUTD model (names as ``faster_rcnn_from_caffe_attr.pkl``'s, after
    :func:`vlbert.detectors.detectron2_checkpoint.read_checkpoint`) in :class:`ButdVisualGenomeModel`'s names.

    Returns:
        (the renamed tensors, the names this model does not use: the box regressor ``bbox_pred``, which BUTD's
        selection never applies, and anything else the file holds).
    """
    out, unused = {}, []
    for name, value in state.items():
        new = None
        if name.startswith("backbone.stem.conv1."):
            rest = name[len("backbone.stem.conv1.") :]
            new = "backbone.conv1.weight" if rest == "weight" else "backbone.bn1." + rest.removeprefix("norm.")
        elif m := re.match(r"^backbone\.res([2-4])\.(\d+)\.(.+)$", name):
            block = _block_key(m.group(3))
            new = f"backbone.layer{int(m.group(1)) - 1}.{m.group(2)}.{block}" if block else None
        elif m := re.match(r"^roi_heads\.res5\.(\d+)\.(.+)$", name):
            block = _block_key(m.group(2))
            new = f"res5.{m.group(1)}.{block}" if block else None
        elif name.startswith("proposal_generator.rpn_head."):
            rest = name[len("proposal_generator.rpn_head.") :]
            layer, _, kind = rest.partition(".")
            new = {"conv": "rpn_head.conv.0.0", "objectness_logits": "rpn_head.cls_logits"}.get(layer)
            new = {"anchor_deltas": "rpn_head.bbox_pred"}.get(layer, new)
            new = f"{new}.{kind}" if new else None
        elif name.startswith("roi_heads.box_predictor.cls_score."):
            new = "cls_score." + name.rsplit(".", 1)[1]
        elif name.startswith("roi_heads.attribute_predictor."):
            new = "attribute_predictor." + name[len("roi_heads.attribute_predictor.") :]
        if new is None:
            unused.append(name)
        else:
            out[new] = value
    return out, unused


def load_butd_model(
    weights: str | os.PathLike, settings: ButdSettings = BUTD_VG_SETTINGS, device: str | torch.device = "cpu"
) -> ButdVisualGenomeModel:
    """:class:`ButdVisualGenomeModel` with the weights of a detectron2-format file (``.pkl`` as
    py-bottom-up-attention's, ``.pth``, ``.safetensors``), built at the file's sizes, every tensor the file's.

    BatchNorm statistics a file lacks are the identity's (mean 0, variance 1), as detectron2's ``FrozenBatchNorm2d``
    fills them when it loads such a file.

    Raises:
        FileNotFoundError: no such file. ValueError: a pickle that asks for code, Caffe2/Detectron names (which
            only detectron2's matching maps: use the detectron2 backend), or weights of another architecture (the
            missing or misshapen tensors named).
    """
    state, caffe2 = read_checkpoint(weights)
    if caffe2:
        raise ValueError(
            f"{weights} holds Caffe2/Detectron parameter names, which only detectron2's name matching maps: run "
            "it with --backend detectron2, or save it in detectron2's format (py-bottom-up-attention's "
            "faster_rcnn_from_caffe_attr.pkl is)"
        )
    state, unused = plain_state_dict(state)
    if unused:
        logger.info("weights %s: %d tensors BUTD's selection does not use (e.g. %s)", weights, len(unused), unused[0])
    architecture = ButdArchitecture.of(state)
    with torch.device("meta"):
        model = ButdVisualGenomeModel(architecture, settings)
    expected = model.state_dict()
    for name, tensor in expected.items():
        if name not in state and name.endswith(("running_mean", "running_var", "num_batches_tracked")):
            fill = {"running_mean": 0.0, "running_var": 1.0}.get(name.rsplit(".", 1)[1], 0)
            state[name] = torch.full(tensor.shape, fill, dtype=tensor.dtype)
    missing = [k for k in expected if k not in state]
    wrong = [
        f"{k}: file {tuple(state[k].shape)}, model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    if missing or wrong:
        raise ValueError(
            f"weights {weights} do not fit BUTD's C4 Faster R-CNN ("
            + "; ".join(([f"missing: {', '.join(missing[:6])}"] if missing else []) + wrong[:4])
            + "); pass py-bottom-up-attention's faster_rcnn_from_caffe_attr.pkl, or run other detectors on the "
            "detectron2 backend"
        )
    model.load_state_dict({k: state[k] for k in expected}, strict=True, assign=True)
    # Non-persistent buffers are not in the state dict: make them again off the meta device.
    model.pixel_mean = torch.tensor(settings.pixel_mean).view(-1, 1, 1)
    model.pixel_std = torch.tensor(settings.pixel_std).view(-1, 1, 1)
    return model.to(device).eval()


def random_butd_state(
    architecture: ButdArchitecture = ButdArchitecture(), seed: int = 0, attributes_in_box_predictor: bool = True
) -> dict[str, np.ndarray]:
    """Seeded random weights of the BUTD model in detectron2's names, as ``faster_rcnn_from_caffe_attr.pkl`` holds
    them (the attribute layers inside ``roi_heads.box_predictor`` when ``attributes_in_box_predictor``), for
    benchmarks and tests: the RPN's box deltas zeroed, so that its proposals are distinct anchors as a trained RPN's
    are, and the norms' scales at 0.2 (untrained identities overflow through 100 residual layers)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = ButdVisualGenomeModel(architecture)
    back = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("num_batches_tracked"):
            continue
        if name.endswith("running_var"):
            value = torch.ones(tensor.shape)
        elif name.endswith(("running_mean", "bias")) or "bbox_pred" in name:
            value = torch.zeros(tensor.shape)
        elif re.search(r"(bn\d|downsample\.1)\.weight$", name):
            value = torch.full(tensor.shape, 0.2)
        else:
            fan_in = max(1, tensor[0].numel())
            value = torch.randn(tensor.shape, generator=generator) / math.sqrt(fan_in)
        back[name] = value
    return {_detectron2_name(k, attributes_in_box_predictor): v.numpy() for k, v in back.items()} | {
        "roi_heads.box_predictor.bbox_pred.weight": np.zeros(
            (4 * architecture.num_classes, 32 * architecture.width), np.float32
        ),
        "roi_heads.box_predictor.bbox_pred.bias": np.zeros(4 * architecture.num_classes, np.float32),
    }


def _detectron2_name(name: str, attributes_in_box_predictor: bool) -> str:
    """This module's parameter name -> detectron2's (the inverse of :func:`plain_state_dict`)."""

    def block(rest: str) -> str:
        if rest.startswith("downsample.0."):
            return "shortcut." + rest[len("downsample.0.") :]
        if rest.startswith("downsample.1."):
            return "shortcut.norm." + rest[len("downsample.1.") :]
        if m := re.match(r"^bn(\d)\.(.+)$", rest):
            return f"conv{m.group(1)}.norm.{m.group(2)}"
        return rest

    if name == "backbone.conv1.weight":
        return "backbone.stem.conv1.weight"
    if name.startswith("backbone.bn1."):
        return "backbone.stem.conv1.norm." + name[len("backbone.bn1.") :]
    if m := re.match(r"^backbone\.layer(\d)\.(\d+)\.(.+)$", name):
        return f"backbone.res{int(m.group(1)) + 1}.{m.group(2)}.{block(m.group(3))}"
    if m := re.match(r"^res5\.(\d+)\.(.+)$", name):
        return f"roi_heads.res5.{m.group(1)}.{block(m.group(2))}"
    for ours, theirs in (
        ("rpn_head.conv.0.0.", "proposal_generator.rpn_head.conv."),
        ("rpn_head.cls_logits.", "proposal_generator.rpn_head.objectness_logits."),
        ("rpn_head.bbox_pred.", "proposal_generator.rpn_head.anchor_deltas."),
        ("cls_score.", "roi_heads.box_predictor.cls_score."),
    ):
        if name.startswith(ours):
            return theirs + name[len(ours) :]
    head = "box_predictor" if attributes_in_box_predictor else "attribute_predictor"
    return f"roi_heads.{head}." + name[len("attribute_predictor.") :]


__all__ = [
    "ButdSettings",
    "BUTD_VG_SETTINGS",
    "AttributePredictor",
    "DetectronAnchors",
    "detectron2_cell_anchors",
    "rpn_proposals",
    "ButdArchitecture",
    "ButdVisualGenomeModel",
    "plain_state_dict",
    "load_butd_model",
    "random_butd_state",
]
