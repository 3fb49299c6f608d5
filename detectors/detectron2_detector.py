"""Region extraction with any detectron2 Faster R-CNN (C4 or FPN), bottom-up-attention style.

Per image (Anderson et al. 2018, section 3.1; the authors' ``generate_tsv.py``): the config's test-time resize
(shortest edge ``INPUT.MIN_SIZE_TEST``, longest at most ``MAX_SIZE_TEST``), the RPN's proposals, each proposal's box
feature (C4: the res5 output mean-pooled, 2048-d; FPN: the box head's last fc, 1024-d) and class distribution,
then :mod:`vlbert.detectors.selection`: per-class NMS (0.3) over the proposals, confidence threshold (0.2), 10..100 boxes.
The regions are the kept proposals themselves (as in ``generate_tsv.py``), so each feature is exactly its box's.
With an attribute head (:mod:`vlbert.detectors.detectron2_butd`) each region also gets its attribute distribution.

Batches hold only images of the same resized size (:func:`vlbert.detectors.images.shape_groups`): padding one image to
another's size changes the convolutions near its border, and so the proposals and features. Batched extraction
therefore gives what one image at a time gives.

Weights are read without detectron2's checkpointer (which unpickles ``.pkl`` files): ``.pkl`` through
:func:`vlbert.detectors.safe_pickle.load_plain_pickle` (numpy arrays and plain containers only), ``.pth`` through
``torch.load(weights_only=True)``, ``.safetensors`` through safetensors.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import numpy as np
import torch
from vlbert.detectors.detectron2_checkpoint import read_checkpoint
from vlbert.detectors.files import read_vocabulary
from vlbert.detectors.images import run_in_shape_groups, to_rgb_array
from vlbert.detectors.regions import Regions
from vlbert.detectors.selection import BoxSelection, butd_regions

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "detectron2 is not on PyPI: install it from source with `pip install --no-build-isolation "
    "'git+https://github.com/facebookresearch/detectron2.git'` (then `pip install fvcore iopath "
    "pycocotools omegaconf hydra-core`); BUTD's Visual Genome model (butd-vg) needs no detectron2: --backend butd"
)


def _require_detectron2():
    try:
        import detectron2  # noqa: F401
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"the detectron2 backend needs detectron2. {INSTALL_HINT}") from e


def resolve_config_file(config_file: str | os.PathLike) -> Path:
    """A config path: a file, ``butd-vg`` (:data:`vlbert.detectors.detectron2_butd.BUTD_VG_CONFIG`), or a model-zoo name such as
    ``COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml`` found among the configs installed with detectron2.

    Raises:
        FileNotFoundError: none of these (the message lists what was tried).
    """
    _require_detectron2()
    import detectron2
    from vlbert.detectors.detectron2_butd import BUTD_VG_CONFIG

    if str(config_file) == "butd-vg":
        return BUTD_VG_CONFIG
    path = Path(config_file).expanduser()
    if path.is_file():
        return path
    zoo = Path(detectron2.__file__).parent / "model_zoo" / "configs" / str(config_file)
    if zoo.is_file():
        return zoo
    raise FileNotFoundError(
        f"detectron2 config {config_file} is neither a file, 'butd-vg', nor a model-zoo name "
        f"(looked in {zoo.parent.parent})"
    )


def load_config(config_file: str | os.PathLike, overrides: dict | None = None):
    """The detectron2 config of a Faster R-CNN: file (see :func:`resolve_config_file`) + ``overrides``
    ({"MODEL.RPN.POST_NMS_TOPK_TEST": 300, ...}), on CPU unless moved.

    Raises:
        FileNotFoundError: no such config. ValueError: unreadable, an unknown key, or not a Faster R-CNN
            (another meta-architecture, a proposal generator other than the RPN, cascade/mask-only heads).
    """
    _require_detectron2()
    from detectron2.config import get_cfg
    from vlbert.detectors.detectron2_butd import add_butd_config

    path = resolve_config_file(config_file)
    cfg = add_butd_config(get_cfg())
    try:
        cfg.merge_from_file(str(path))
        for key, value in (overrides or {}).items():
            cfg.merge_from_list([key, value if isinstance(value, str) else repr(value)])
    except (KeyError, ValueError, AssertionError, TypeError) as e:
        raise ValueError(f"detectron2 config {path}: {type(e).__name__}: {e}") from e
    problems = []
    if cfg.MODEL.META_ARCHITECTURE != "GeneralizedRCNN":
        problems.append(f"MODEL.META_ARCHITECTURE is {cfg.MODEL.META_ARCHITECTURE!r}")
    if cfg.MODEL.PROPOSAL_GENERATOR.NAME != "RPN":
        problems.append(f"MODEL.PROPOSAL_GENERATOR.NAME is {cfg.MODEL.PROPOSAL_GENERATOR.NAME!r}")
    if "Cascade" in cfg.MODEL.ROI_HEADS.NAME:
        problems.append(f"MODEL.ROI_HEADS.NAME is {cfg.MODEL.ROI_HEADS.NAME!r}")
    if problems:
        raise ValueError(
            f"detectron2 config {path} is not a Faster R-CNN ({'; '.join(problems)}); the detectron2 "
            "backend needs GeneralizedRCNN + RPN + Res5ROIHeads (C4) or StandardROIHeads (FPN), e.g. "
            "COCO-Detection/faster_rcnn_R_50_FPN_3x.yaml or butd-vg"
        )
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.WEIGHTS = ""
    return cfg


@contextlib.contextmanager
def _initial_weights_not_drawn():
    """``torch.nn.init``'s in-place fills do nothing while a model is built whose every tensor a strict load then
    sets (:func:`load_weights`), so building a detector draws no initial weights (docs/performance.md). As
    transformers' ``no_init_weights`` (transformers/initialization.py), without its import of transformers'
    modeling code. Not thread-safe: it patches the module while a model is built."""
    fills = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_")
    fills += ("xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_")
    saved = {name: getattr(torch.nn.init, name) for name in fills}
    for name in fills:
        setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fill in saved.items():
            setattr(torch.nn.init, name, fill)


def load_weights(model: torch.nn.Module, weights: str | os.PathLike) -> None:
    """Load a checkpoint (see :func:`read_checkpoint`) into a detectron2 model built from a config, strictly.

    Raises:
        ValueError: the config and the weights do not fit each other: a parameter of another shape (e.g. 80 COCO
            classes against a 1600-class config), or model parameters the file lacks (another architecture); the
            message names the first few. Keys only the file has (e.g. a mask head) are logged and ignored.
    """
    state, caffe2 = read_checkpoint(weights)
    model_state = model.state_dict()
    if caffe2:
        from detectron2.checkpoint.c2_model_loading import align_and_update_state_dicts

        state = align_and_update_state_dicts(model_state, state, c2_conversion=True)
    wrong = [
        f"{k}: file {tuple(v.shape)}, config {tuple(model_state[k].shape)}"
        for k, v in state.items()
        if k in model_state and tuple(v.shape) != tuple(model_state[k].shape)
    ]
    missing = [k for k in model_state if k not in state]
    if wrong or missing:
        detail = "; ".join(
            ([f"shapes differ: {', '.join(wrong[:4])}"] if wrong else [])
            + (
                [
                    f"missing from the file: {', '.join(missing[:6])}"
                    + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
                ]
                if missing
                else []
            )
        )
        raise ValueError(
            f"weights {weights} do not fit the detectron2 config ({detail}); pass the config file the "
            "weights were trained with (e.g. butd-vg for py-bottom-up-attention's "
            "faster_rcnn_from_caffe_attr.pkl)"
        )
    unexpected = [k for k in state if k not in model_state]
    if unexpected:
        logger.info("weights %s: %d keys the model does not use (e.g. %s)", weights, len(unexpected), unexpected[0])
    model.load_state_dict({k: v for k, v in state.items() if k in model_state}, strict=True)


def extractor_name(
    config_file: str | os.PathLike,
    weights: str | os.PathLike,
    min_boxes: int,
    max_boxes: int,
    score_threshold: float,
    nms_iou: float,
) -> str:
    """The name this backend writes into every :class:`~vlbert.detectors.regions.Regions` it extracts (and a store's
    ``detector.json``): ``detectron2:<config file name>(weights=<file name>,thr=..,boxes=min-max,nms=..)``; the
    published families record their features under it (``vlbert.families``)."""
    return (
        f"detectron2:{Path(str(config_file)).name}(weights={Path(str(weights)).name},"
        f"thr={score_threshold},boxes={min_boxes}-{max_boxes},nms={nms_iou})"
    )


class Detectron2RegionDetector:
    """Image -> :class:`~vlbert.detectors.regions.Regions` with a detectron2 Faster R-CNN, BUTD's way (module docstring).

    Args:
        config_file: a config file, ``butd-vg``, or a model-zoo name (:func:`resolve_config_file`).
        weights: ``.pkl`` / ``.pth`` / ``.safetensors`` checkpoint for that config (:func:`load_weights`).
        device: where the model runs ("cpu", "cuda", "cuda:1").
        min_boxes, max_boxes, score_threshold, nms_iou: BUTD's 10, 100, 0.2 and 0.3 (36/36 for fixed counts).
        overrides: detectron2 config overrides, {"KEY.PATH": value}.
        class_names, attribute_names: vocabulary files (one name per line, e.g. Visual Genome's
            objects_vocab.txt / attributes_vocab.txt); default: the test dataset's ``thing_classes`` from
            detectron2's metadata where registered (COCO), else ``class_<i>`` / ``attribute_<i>``.
    Raises:
        ModuleNotFoundError: detectron2 is not installed (the message says how). FileNotFoundError,
        ValueError: from :func:`load_config` and :func:`load_weights`; a names file of the wrong length.
    """

    def __init__(
        self,
        config_file: str | os.PathLike,
        weights: str | os.PathLike,
        device: str = "cpu",
        min_boxes: int = 10,
        max_boxes: int = 100,
        score_threshold: float = 0.2,
        nms_iou: float = 0.3,
        overrides: dict | None = None,
        class_names: str | os.PathLike | None = None,
        attribute_names: str | os.PathLike | None = None,
    ):
        _require_detectron2()
        from detectron2.data import transforms as T
        from detectron2.modeling import build_model
        from detectron2.modeling.roi_heads import Res5ROIHeads, StandardROIHeads

        cfg = load_config(config_file, overrides)
        with _initial_weights_not_drawn():  # load_weights sets every tensor from the file, or raises
            model = build_model(cfg)
        if not isinstance(model.roi_heads, (Res5ROIHeads, StandardROIHeads)):
            raise ValueError(
                f"detectron2 config {config_file}: ROI heads {type(model.roi_heads).__name__} are "
                "neither Res5ROIHeads (C4) nor StandardROIHeads (FPN)"
            )
        load_weights(model, weights)
        self.cfg = cfg
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.resize = T.ResizeShortestEdge([cfg.INPUT.MIN_SIZE_TEST] * 2, cfg.INPUT.MAX_SIZE_TEST)
        self.bgr = cfg.INPUT.FORMAT == "BGR"
        self.selection = BoxSelection(min_boxes, max_boxes, score_threshold, nms_iou)
        self.c4 = isinstance(model.roi_heads, Res5ROIHeads)
        self.attributes = getattr(model.roi_heads, "attribute_predictor", None)
        self.class_names = self._names(class_names, self.num_classes, "class", cfg)
        self.attribute_names = (
            self._names(attribute_names, self.attributes.num_attributes, "attribute", None)
            if self.attributes is not None
            else None
        )
        self.name = extractor_name(config_file, weights, min_boxes, max_boxes, score_threshold, nms_iou)

    @staticmethod
    def _names(path, count: int, kind: str, cfg) -> list[str]:
        if path is not None:
            return read_vocabulary(path, count, kind)
        if cfg is not None and cfg.DATASETS.TEST:
            from detectron2.data import MetadataCatalog

            try:
                names = list(MetadataCatalog.get(cfg.DATASETS.TEST[0]).thing_classes)
                if len(names) == count:
                    return names
            except AttributeError:
                pass
        return [f"{kind}_{i}" for i in range(count)]

    @property
    def num_classes(self) -> int:
        return int(self.cfg.MODEL.ROI_HEADS.NUM_CLASSES)

    @property
    def feature_dim(self) -> int:
        if self.c4:
            return int(self.cfg.MODEL.RESNETS.RES2_OUT_CHANNELS * 8)
        return int(self.model.roi_heads.box_head.output_shape.channels)

    def metadata(self) -> dict:
        """What travels with the shards (``detector.json``): the extractor's name, feature size, class names and
        attribute names (None without an attribute head)."""
        return {
            "detector": self.name,
            "feature_dim": self.feature_dim,
            "class_names": self.class_names,
            "attribute_names": self.attribute_names,
        }

    def _prepare(self, array: np.ndarray) -> torch.Tensor:
        """uint8 [H, W, 3] RGB -> float32 [3, h, w] in the model's channel order, resized as the config says."""
        resized = self.resize.get_transform(array).apply_image(array)
        if self.bgr:
            resized = resized[:, :, ::-1]
        return torch.as_tensor(np.ascontiguousarray(resized.transpose(2, 0, 1)), dtype=torch.float32)

    def __call__(self, image, image_id: str) -> Regions:
        """One image (PIL image or uint8 array, any mode :func:`vlbert.detectors.images.to_rgb_array` converts)."""
        return self.extract_batch([image], [image_id])[0]

    @torch.no_grad()
    def extract_batch(self, images: list, image_ids: list[str], batch_size: int | None = None) -> list[Regions]:
        """:meth:`__call__` for several images; images of equal resized size share a forward pass (at most
        ``batch_size``, default all), so the result equals one image at a time. Output in input order."""
        arrays = [to_rgb_array(im) for im in images]
        sizes = [a.shape[:2] for a in arrays]
        prepared = [self._prepare(a) for a in arrays]
        return run_in_shape_groups(
            [tuple(t.shape) for t in prepared],
            batch_size,
            lambda group: self._forward(
                [prepared[i] for i in group], [sizes[i] for i in group], [image_ids[i] for i in group]
            ),
        )

    def _forward(
        self, tensors: list[torch.Tensor], sizes: list[tuple[int, int]], image_ids: list[str]
    ) -> list[Regions]:
        m, heads = self.model, self.model.roi_heads
        images = m.preprocess_image([{"image": t.to(self.device)} for t in tensors])
        features = m.backbone(images.tensor)
        proposals, _ = m.proposal_generator(images, features, None)
        boxes = [p.proposal_boxes for p in proposals]
        if self.c4:
            pooled = heads._shared_roi_transform([features[f] for f in heads.in_features], boxes).mean(dim=(2, 3))
        else:
            pooled = heads.box_head(heads.box_pooler([features[f] for f in heads.box_in_features], boxes))
        logits, _ = heads.box_predictor(pooled)
        probs = logits.softmax(-1)[:, :-1]  # detectron2 puts background last
        out, start = [], 0
        for proposal_boxes, size, image_id, resized_size in zip(
            boxes, sizes, image_ids, images.image_sizes, strict=True
        ):
            n = len(proposal_boxes)
            span = slice(start, start + n)
            start += n
            out.append(
                butd_regions(
                    image_id,
                    size,
                    tuple(resized_size),
                    proposal_boxes.tensor,
                    probs[span],
                    pooled[span],
                    self.name,
                    self.selection,
                    self.attributes,
                )
            )
        return out


__all__ = ["Detectron2RegionDetector", "load_config", "load_weights", "resolve_config_file", "INSTALL_HINT"]
