"""VL-BERT (Su et al., ICLR 2020; jackroos/VL-BERT at 4373674): ``vl-bert-{base,large}-prec.model`` (regions
precomputed by bottom-up attention) and ``vl-bert-{base,large}-e2e.model`` (a Caffe ResNet-101 C4 backbone and res5
RoI head trained with the BERT under fixed boxes). Each is a ``torch.save({'state_dict': ..., 'optimizer': ...})``
of ``ResNetVLBERTForPretrainingMultitask`` wrapped in DistributedDataParallel (``module.`` prefixes); only the state
dict is read, without unpickling code, and the optimizer is dropped.

Keys (``pretrain/modules/resnet_vlbert_for_pretraining_multitask.py``, ``common/visual_linguistic_bert.py``,
``common/fast_rcnn.py``) -> ours:

| VL-BERT (after ``module.``) | vlbert |
|---|---|
| ``vlbert.{word,position,token_type}_embeddings``, ``vlbert.embedding_LayerNorm``, ``vlbert.encoder.*`` | ``bert.embeddings.*``, ``bert.encoder.*`` (3 token types) |
| ``vlbert.end_embedding``, ``vlbert.visual_ln_text`` / ``visual_ln_object`` | ``bert.region_embeddings.end_embedding`` / ``visual_ln_text`` / ``visual_ln_object`` |
| ``image_feature_extractor.obj_downsample.1`` (Linear 4096 -> H) | ``bert.region_embeddings.visual_proj`` |
| ``object_linguistic_embeddings``, ``object_mask_word_embedding`` | ``bert.region_embeddings.object_embedding``, ``object_mask_embedding`` |
| ``object_mask_visual_embedding`` [1, 2048] (prec) | ``bert.region_embeddings.mask_visual_embedding`` [2048] |
| ``aux_text_visual_embedding`` | ``bert.region_embeddings.aux_text_visual_embedding`` |
| ``vlbert.mlm_head.predictions.*`` (decoder tied to the word embeddings) | ``masked_lm.*`` |
| ``vlbert.mvrc_head.transform.dense`` / ``region_cls_pred`` (1601 classes) | ``mrc.dense`` / ``mrc.decoder`` (no LayerNorm) |
| ``image_feature_extractor.backbone.*`` (e2e) | ``bert.visual_backbone.body.*`` (:class:`~vlbert.models.visual_backbone.CaffeResNetC4`) |
| ``image_feature_extractor.roi_head_feature_extractor.*`` = ``head.0.*`` (e2e, checked equal) | ``bert.visual_backbone.head.*`` |

No pooler and no relationship (ITM) head are published (``with_pooler: false``, ``WITH_REL_LOSS: false``): both are
newly initialised. Tokenizer: bert-base-uncased. Features: prec = bottom-up-attention Faster R-CNN on Visual Genome,
10-100 boxes at 0.2 (as UNITER's); e2e = the images themselves under those boxes (the model's backbone computes the
features: BGR, means 102.98/115.95/122.77 subtracted, short side 600, long side <= 1000).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from vlbert.checkpoint import hf_to_vlbert
from vlbert.families.base import (
    CheckpointFamily,
    Converted,
    WrongForm,
    architecture,
    detector_features,
    load_torch_object,
    rename_prefix,
    source_prefix,
    take_tied,
    to_float32,
)
from vlbert.families.uniter import BUTD_VG

RENAMES = {
    "vlbert.word_embeddings.": "bert.embeddings.word_embeddings.",
    "vlbert.position_embeddings.": "bert.embeddings.position_embeddings.",
    "vlbert.token_type_embeddings.": "bert.embeddings.token_type_embeddings.",
    "vlbert.embedding_LayerNorm.": "bert.embeddings.LayerNorm.",
    "vlbert.encoder.": "bert.encoder.",
    "vlbert.pooler.": "bert.pooler.",
    "vlbert.end_embedding.": "bert.region_embeddings.end_embedding.",
    "vlbert.visual_ln_text.": "bert.region_embeddings.visual_ln_text.",
    "vlbert.visual_ln_object.": "bert.region_embeddings.visual_ln_object.",
    "vlbert.mlm_head.predictions.": "cls.predictions.",
    "vlbert.mvrc_head.transform.dense.": "mrc.dense.",
    "vlbert.mvrc_head.region_cls_pred.": "mrc.decoder.",
    "image_feature_extractor.obj_downsample.1.": "bert.region_embeddings.visual_proj.",
    "object_linguistic_embeddings.": "bert.region_embeddings.object_embedding.",
    "object_mask_word_embedding.": "bert.region_embeddings.object_mask_embedding.",
    "aux_text_visual_embedding.": "bert.region_embeddings.aux_text_visual_embedding.",
    "image_feature_extractor.backbone.": "bert.visual_backbone.body.",
    "image_feature_extractor.roi_head_feature_extractor.": "bert.visual_backbone.head.",
}
BACKBONE = "image_feature_extractor.backbone."


def read_vl_bert_file(source: Path) -> dict[str, torch.Tensor]:
    """The state dict of a VL-BERT ``.model`` file, ``module.`` prefixes removed, read by
    :func:`~vlbert.families.base.load_torch_object` (tensors and plain containers only); the optimizer state is
    dropped.

    Raises:
        WrongForm: a directory.
        ValueError: a damaged file or one that holds code or objects (whatever the unpickler raises); a file with an
            optimizer state but no model state (VL-BERT's ``.model`` files hold both); no tensors.
    """
    if source.is_dir():
        raise WrongForm(f"{source} is a directory; a VL-BERT checkpoint is one .model file (vl-bert-base-prec.model)")
    saved = load_torch_object(source, "VL-BERT checkpoint ({'state_dict': ..., 'optimizer': ...} of tensors)")
    if isinstance(saved, dict) and "state_dict" not in saved and "optimizer" in saved:
        raise ValueError(
            f"{source} holds only an optimizer state, no 'state_dict'; pass the .model file that "
            "VL-BERT's trainer saved with both"
        )
    state = saved.get("state_dict", saved) if isinstance(saved, dict) else None
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(
            f"{source} holds no state dict of tensors; a VL-BERT .model file is {{'state_dict': ..., 'optimizer': ...}}"
        )
    return without_module_prefix(state)


def without_module_prefix(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with DistributedDataParallel's ``module.`` prefixes removed."""
    return {k[len("module.") :] if k.startswith("module.") else k: v for k, v in state.items()}


def network_section(source_config: dict) -> dict:
    """The ``NETWORK`` section of a VL-BERT YAML config (``cfgs/pretrain/*.yaml``), or {} without one."""
    return source_config.get("NETWORK", {}) if isinstance(source_config, dict) else {}


def backbone_layers(state: dict[str, torch.Tensor]) -> list[int]:
    """Blocks per stage of the e2e backbone (res2-res4) from its keys: [3, 4, 23] for ResNet-101."""
    blocks: dict[int, set[int]] = {}
    for key in state:
        m = re.match(re.escape(BACKBONE) + r"layer(\d)\.(\d+)\.", key)
        if m:
            blocks.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    return [len(blocks.get(i, ())) for i in (1, 2, 3)]


class VLBertFamily(CheckpointFamily):
    """VL-BERT's published ``.model`` files (see the module docstring for the key map)."""

    def read(self, source: Path):
        return read_vl_bert_file(source), {}

    def normalise(self, state):
        return without_module_prefix(state)

    def matches(self, state) -> bool:
        return any(k.startswith(("vlbert.word_embeddings.", "vlbert.encoder.")) for k in state)

    def source_key(self, key: str) -> str:
        return "module." + source_prefix(key, RENAMES)

    def convert(self, state, source_config) -> Converted:
        network = network_section(source_config)
        e2e = any(k.startswith(BACKBONE) for k in state)
        if "IMAGE_FEAT_PRECOMPUTED" in network and bool(network["IMAGE_FEAT_PRECOMPUTED"]) == e2e:
            have, said = ("an e2e", "precomputed") if e2e else ("a prec", "e2e")
            raise ValueError(
                f"this is {have} checkpoint ({'with' if e2e else 'without'} backbone tensors) but the "
                f"config says {said} (IMAGE_FEAT_PRECOMPUTED: {network['IMAGE_FEAT_PRECOMPUTED']}); "
                "pass the config the checkpoint was trained with"
            )
        state = to_float32(state)
        take_tied(state, "vlbert.mlm_head.predictions.decoder.weight", "vlbert.word_embeddings.weight")
        if e2e:
            _drop_head_copy(state)
            layers = backbone_layers(state)
        mask_visual = state.pop("object_mask_visual_embedding.weight", None)
        state = hf_to_vlbert(rename_prefix(state, RENAMES))
        if mask_visual is not None:
            state["bert.region_embeddings.mask_visual_embedding"] = mask_visual.reshape(-1)
        heads = network.get("VLBERT", {}).get("num_attention_heads") or source_config.get("num_attention_heads")
        config = architecture(state, {"num_attention_heads": heads} if heads else {})
        visual = state["bert.region_embeddings.visual_proj.weight"]
        config.update(
            region_embedding="vl-bert",
            region_location_dim=4,
            region_token_type=2,
            region_feature_dim=visual.shape[1] - 2048,
            region_head_norm=False,
            num_region_classes=state["mrc.decoder.weight"].shape[0] if "mrc.decoder.weight" in state else 0,
        )
        if e2e:
            config["visual_backbone"] = {
                "kind": "caffe-resnet",
                "layers": layers,
                "frozen_stages": list(network.get("IMAGE_FROZEN_BACKBONE_STAGES", [1, 2])),
                "frozen_bn": bool(network.get("IMAGE_FROZEN_BN", True)),
                "mask_pixels": mask_visual is None and bool(network.get("MASK_RAW_PIXELS", True)),
            }
        info = {"image_preprocessing": "vl-bert"} if e2e else {}  # vlbert.processing.images.PREPROCESSING's entry
        return Converted(config, state, "VLBertForPreTraining", "vl-pretraining", info=info)


def _drop_head_copy(state: dict[str, torch.Tensor]) -> None:
    """Drop ``image_feature_extractor.head.0.*``, the second name of the res5 head (``FastRCNN.head`` is a
    Sequential holding ``roi_head_feature_extractor``), after checking each tensor equals the first name's.

    Raises:
        ValueError: a copy that differs, or is missing: the file was not written by VL-BERT's code.
    """
    first, second = "image_feature_extractor.roi_head_feature_extractor.", "image_feature_extractor.head.0."
    copies = {k[len(second) :]: state.pop(k) for k in [k for k in state if k.startswith(second)]}
    originals = {k[len(first) :]: v for k, v in state.items() if k.startswith(first)}
    if set(copies) != set(originals):
        raise ValueError(
            f"the res5 head's two copies ({first}* and {second}*) hold different tensors; this file "
            "was not written by VL-BERT's code"
        )
    differ = sorted(k for k, v in copies.items() if v.shape != originals[k].shape or not torch.equal(v, originals[k]))
    if differ:
        raise ValueError(
            f"the res5 head's two copies differ at {second}{differ[0]} (and {len(differ) - 1} more); "
            "VL-BERT's code writes one module under both names, so this file was altered"
        )


VL_BERT = VLBertFamily(
    name="vl-bert",
    region_embedding="vl-bert",
    tokenizer="bert-base-uncased",
    cased=False,
    features=detector_features(
        BUTD_VG,
        100,
        "prec: bottom-up-attention Faster R-CNN ResNet-101 (Visual Genome, "
        "Caffe), 10-100 boxes at confidence >= 0.2, 2048-d pool5, the whole-image box first "
        "(the mean feature); e2e: the images under those boxes through the model's own "
        "ResNet-101 C4 + res5",
    ),
    max_text_length=64,
    reference="jackroos/VL-BERT@4373674",
    parity=(
        "hidden states, MLM and region-class logits equal a reference forward written from VL-BERT's code "
        "within 1e-5 (float32, prec and e2e; vlbert tests/published/test_vl_bert.py)"
    ),
)

__all__ = ["VL_BERT", "VLBertFamily", "read_vl_bert_file", "backbone_layers"]
