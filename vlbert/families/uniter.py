"""UNITER (Chen et al. 2020; ChenRocks/UNITER at 1dbfa62): ``uniter-base.pt`` / ``uniter-large.pt`` and the
fine-tuned VQA checkpoints, bare ``torch.save(state_dict)`` files with the backbone under ``uniter.``.

Keys (``model/model.py``, ``model/pretrain.py``, ``model/vqa.py``) -> ours:

| UNITER | vlbert |
|---|---|
| ``uniter.embeddings.*``, ``uniter.encoder.layer.{i}.*``, ``uniter.pooler.*`` | ``bert.*`` (BERT names, q/k/v fused) |
| ``uniter.img_embeddings.img_linear`` / ``img_layer_norm`` | ``bert.region_embeddings.feature_proj`` / ``feature_norm`` |
| ``uniter.img_embeddings.pos_linear`` / ``pos_layer_norm`` | ``bert.region_embeddings.location_proj`` / ``location_norm`` |
| ``uniter.img_embeddings.LayerNorm`` / ``mask_embedding`` | ``bert.region_embeddings.norm`` / ``mask_embedding`` (row 0 zeroed, as its forward does) |
| ``cls.predictions.*`` (decoder tied to the word embeddings) | ``masked_lm.*`` |
| ``feat_regress.net.0`` / ``net.2``, ``feat_regress.weight`` (tied to ``img_linear``, used transposed) / ``bias`` | ``mrfr.dense`` / ``norm``, ``mrfr.decoder`` (weight = img_linear.weight^T, a copy) |
| ``region_classifier.net.0`` / ``net.2`` / ``net.3`` (1601 = 1600 VG classes + background) | ``mrc.dense`` / ``norm`` / ``decoder`` |
| ``itm_output`` (``ITM`` in the 2020 file) | ``itm`` |
| ``vqa_output.0`` / ``.2`` / ``.3`` (3129 answers) | ``vqa_head.0`` / ``.2`` / ``.3`` (:class:`~vlbert.models.vqa.VLBertForVQA`) |
| ``vqa_output.*`` with 3 outputs (``model/ve.py``: SNLI-VE) | ``vqa_head.*`` of :class:`~vlbert.models.uniter_heads.VLBertForVisualEntailment` (labels contradiction, entailment, neutral) |
| ``rank_output`` [1, H] (``model/itm.py``: retrieval) | ``itm`` of :class:`~vlbert.models.retrieval.VLBertForImageTextRetrieval`: row 1 = ``rank_output``, row 0 = 0, so the re-ranker's margin is UNITER's rank score (its own ``itm_output`` is not read by its retrieval forward and is dropped) |
| ``nlvr2_output`` [2, 2H] (``model/nlvr2.py`` paired) | :class:`~vlbert.models.uniter_heads.VLBertForNLVR2Paired` (3 token types: images typed 1 and 2) |
| ``attn1``, ``attn2``, ``fc``, ``attn_pool``, ``nlvr2_output`` (paired-attn) | :class:`~vlbert.models.uniter_heads.VLBertForNLVR2PairedAttention` |

The architecture comes from the tensors' shapes (head size 64, as both published configs); tensors are upcast from
float16. Tokenizer: bert-base-cased (28,996 pieces; ``prepro.py``). Regions: BUTD Caffe ResNet-101 on Visual
Genome, 10-100 boxes at confidence >= 0.2, 2048-d (BUTD-UNITER-NLVR2 ``tools/generate_npz.py``), which our
``butd`` backend reproduces (no detectron2 needed) with py-bottom-up-attention's ``faster_rcnn_from_caffe_attr.pkl``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vlbert.checkpoint import hf_to_vlbert
from vlbert.detectors.config import NAMED_DETECTORS
from vlbert.families.base import (
    CheckpointFamily,
    Converted,
    WrongForm,
    architecture,
    detector_features,
    load_torch_file,
    rename_prefix,
    source_prefix,
    take_tied,
    to_float32,
)

#: The features' detector as far as it is published: the weights file's name (no sha256 is published for it), so
#: regions match on that name (detectors/config.py, docs/regions.md).
BUTD_VG = NAMED_DETECTORS["butd-vg"]

RENAMES = {
    "uniter.": "bert.",
    "bert.img_embeddings.img_linear.": "bert.region_embeddings.feature_proj.",
    "bert.img_embeddings.img_layer_norm.": "bert.region_embeddings.feature_norm.",
    "bert.img_embeddings.pos_linear.": "bert.region_embeddings.location_proj.",
    "bert.img_embeddings.pos_layer_norm.": "bert.region_embeddings.location_norm.",
    "bert.img_embeddings.LayerNorm.": "bert.region_embeddings.norm.",
    "bert.img_embeddings.mask_embedding.": "bert.region_embeddings.mask_embedding.",
    "feat_regress.net.0.": "mrfr.dense.",
    "feat_regress.net.2.": "mrfr.norm.",
    "feat_regress.bias": "mrfr.decoder.bias",
    "region_classifier.net.0.": "mrc.dense.",
    "region_classifier.net.2.": "mrc.norm.",
    "region_classifier.net.3.": "mrc.decoder.",
    "itm_output.": "itm.",
    "ITM.": "itm.",
    "vqa_output.": "vqa_head.",
}


class UniterFamily(CheckpointFamily):
    """UNITER checkpoints (see the module docstring for the key map)."""

    def read(self, source: Path):
        if source.is_dir():
            files = sorted(source.glob("*.pt"))
            if len(files) != 1:
                raise WrongForm(f"{source} holds {len(files)} .pt files; name the UNITER checkpoint file itself")
            source = files[0]
        return load_torch_file(source), {}

    def matches(self, state) -> bool:
        return any(k.startswith("uniter.embeddings.") for k in state)

    def source_key(self, key: str) -> str:
        return source_prefix(key, RENAMES)

    def convert(self, state, source_config) -> Converted:
        state = to_float32(state)
        take_tied(state, "cls.predictions.decoder.weight", "uniter.embeddings.word_embeddings.weight")
        take_tied(state, "feat_regress.weight", "uniter.img_embeddings.img_linear.weight")
        if "feat_regress.net.0.weight" in state:
            state["mrfr.decoder.weight"] = state["uniter.img_embeddings.img_linear.weight"].t().contiguous()
        state = rename_prefix(state, RENAMES)
        if "bert.region_embeddings.mask_embedding.weight" in state:
            state["bert.region_embeddings.mask_embedding.weight"][0] = 0.0
        state = hf_to_vlbert(state)
        config = architecture(state, source_config)
        config.update(
            region_embedding="uniter",
            region_location_dim=7,
            region_token_type=1,
            region_feature_dim=state["bert.region_embeddings.feature_proj.weight"].shape[1],
        )
        if "mrc.decoder.weight" in state:
            config["num_region_classes"] = state["mrc.decoder.weight"].shape[0]
        head = _fine_tuned_head(state, config)
        if head is not None:
            return head
        config.setdefault("num_region_classes", 1601)
        return Converted(config, state, "VLBertForPreTraining", "vl-pretraining")


#: UNITER's SNLI-VE label order (``utils/misc.py`` ``VE_IDX2ENT``).
VE_LABELS = ["contradiction", "entailment", "neutral"]
#: a retrieval checkpoint's cross-encoder ranks every candidate (UNITER has no dual encoder to shortlist with).
RANK_ALL = 1_000_000_000


def _fine_tuned_head(state: dict, config: dict) -> Converted | None:
    """The Converted of a fine-tuned UNITER head in ``state`` (our names; ``config`` completed in place), or None
    for a pretraining checkpoint.

    Raises:
        ValueError: an NLVR2 ``triplet`` head (one sequence with both images), which has no vlbert model.
    """
    if "vqa_head.3.weight" in state:
        config["num_labels"] = state["vqa_head.3.weight"].shape[0]
        if config["num_labels"] == 3:  # model/ve.py: the VQA head over the three SNLI-VE labels
            return Converted(config, state, "VLBertForVisualEntailment", "snli-ve", labels=VE_LABELS)
        return Converted(config, state, "VLBertForVQA", "vqa")
    if "rank_output.weight" in state:  # model/itm.py: the score is rank_output(pooled); itm_output is unused
        rank_w, rank_b = state.pop("rank_output.weight"), state.pop("rank_output.bias")
        dropped = {
            f"itm_output.{k}": "UNITER's retrieval model scores with rank_output only (its itm_output is "
            "left from pretraining)"
            for k in ("weight", "bias")
            if state.pop(f"itm.{k}", None) is not None
        }
        state["itm.weight"] = torch.cat([torch.zeros_like(rank_w), rank_w])
        state["itm.bias"] = torch.cat([torch.zeros_like(rank_b), rank_b])
        return Converted(
            config, state, "VLBertForImageTextRetrieval", "retrieval", dropped=dropped, info={"shortlist": RANK_ALL}
        )
    if "nlvr2_output.weight" in state:
        if state["nlvr2_output.weight"].shape[1] != 2 * config["hidden_size"]:
            raise ValueError(
                "this is UNITER's NLVR2 'triplet' head (both images in one sequence); vlbert converts "
                "its 'paired' and 'paired-attn' heads (model/nlvr2.py): use one of those checkpoints"
            )
        config["num_labels"] = state["nlvr2_output.weight"].shape[0]
        attention = "attn1.in_proj_weight" in state
        return Converted(
            config, state, "VLBertForNLVR2PairedAttention" if attention else "VLBertForNLVR2Paired", "nlvr2"
        )
    return None


UNITER = UniterFamily(
    name="uniter",
    region_embedding="uniter",
    tokenizer="bert-base-cased",
    cased=True,
    features=detector_features(
        BUTD_VG,
        100,
        "bottom-up-attention Faster R-CNN ResNet-101 (Visual Genome, Caffe), "
        "10-100 boxes at confidence >= 0.2, 2048-d pool5 + 7-d box",
    ),
    max_text_length=60,
    reference="ChenRocks/UNITER@1dbfa62",
    parity=(
        "hidden states and every head's logits equal a reference forward written from UNITER's code "
        "within 1e-5 (float32, 10 and 100 regions; vlbert tests/published/test_published_checkpoints.py)"
    ),
)

__all__ = ["UNITER", "UniterFamily", "BUTD_VG", "VE_LABELS"]
