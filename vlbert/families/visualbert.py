"""VisualBERT (Li et al. 2019) as transformers ports it (``modeling_visual_bert.py``; hub names
``uclanlp/visualbert-{vqa,vqa-pre,vqa-coco-pre,nlvr2,nlvr2-pre,nlvr2-coco-pre}``): a ``save_pretrained`` directory
with ``config.json`` (model_type ``visual_bert``) and the weights.

Keys -> ours:

| transformers | vlbert |
|---|---|
| ``visual_bert.embeddings.{word,position,token_type}_embeddings``, ``LayerNorm``, ``encoder.*``, ``pooler.*`` | ``bert.*`` |
| ``visual_bert.embeddings.visual_projection`` | ``bert.region_embeddings.feature_proj`` |
| ``visual_bert.embeddings.visual_token_type_embeddings`` / ``visual_position_embeddings`` | ``bert.region_embeddings.token_type_embeddings`` / ``position_embeddings`` |
| ``cls.predictions.*`` (``VisualBertForPreTraining``) | ``masked_lm.*`` |
| ``cls.seq_relationship`` (0 = the caption matches the image) | ``itm`` with its rows swapped (our 1 = match) |
| ``cls`` of ``VisualBertForQuestionAnswering`` ([MASK]-position head) | ``classifier`` of :class:`~vlbert.models.vqa.VLBertForMaskedTokenVQA` |
| ``cls`` of ``VisualBertForVisualReasoning`` | ``classifier`` of :class:`~vlbert.models.vl_classification.VLBertForVisualReasoning` |

Regions get visual token type 0 (``region_token_type``): the original VQA/COCO code never passed a type, and
its objective then used zeros (transformers' default of ones differs). Tokenizer: bert-base-uncased. Features:
Detectron (v1) fc6, 2048-d, 100 boxes for VQA/COCO (Pythia's ``detectron_fix_100``), 1024-d for NLVR2: none of our
backends reproduces them, so a converted VisualBERT takes imported regions.
"""

from __future__ import annotations

from pathlib import Path

from vlbert.checkpoint import hf_to_vlbert
from vlbert.families.base import CheckpointFamily, Converted, architecture, read_directory, rename_prefix, to_float32

RENAMES = {
    "visual_bert.": "bert.",
    "bert.embeddings.visual_projection.": "bert.region_embeddings.feature_proj.",
    "bert.embeddings.visual_token_type_embeddings.": "bert.region_embeddings.token_type_embeddings.",
    "bert.embeddings.visual_position_embeddings.": "bert.region_embeddings.position_embeddings.",
}
#: transformers architecture -> (our model class, inference task).
HEADS = {
    "VisualBertForPreTraining": ("VLBertForPreTraining", "vl-pretraining"),
    "VisualBertModel": ("VLBertForPreTraining", "vl-pretraining"),
    "VisualBertForQuestionAnswering": ("VLBertForMaskedTokenVQA", "vqa"),
    "VisualBertForVisualReasoning": ("VLBertForVisualReasoning", "nlvr2"),
}


class VisualBertFamily(CheckpointFamily):
    """transformers VisualBERT checkpoints (see the module docstring for the key map)."""

    def read(self, source: Path):
        state, config = read_directory(source, "a VisualBERT checkpoint (as transformers' save_pretrained writes it)")
        return self.normalise(state), config

    def normalise(self, state):
        if "embeddings.visual_projection.weight" in state:  # a bare VisualBertModel saves no prefix
            state = {"visual_bert." + k: v for k, v in state.items()}
        return state

    def matches(self, state) -> bool:
        return any(k.startswith("visual_bert.embeddings.") for k in state)

    def convert(self, state, source_config) -> Converted:
        state = to_float32({k: v for k, v in state.items() if not k.endswith("position_ids")})
        state.pop("cls.predictions.decoder.bias", None)  # a copy of cls.predictions.bias
        architectures = source_config.get("architectures") or []
        head = next((a for a in architectures if a in HEADS), None) or _head_from_keys(state, architectures)
        model_class, task = HEADS[head]
        if "cls.weight" in state:
            state["classifier.weight"], state["classifier.bias"] = state.pop("cls.weight"), state.pop("cls.bias")
        if "cls.seq_relationship.weight" in state:
            state["itm.weight"] = state.pop("cls.seq_relationship.weight").flip(0)
            state["itm.bias"] = state.pop("cls.seq_relationship.bias").flip(0)
        state = hf_to_vlbert(rename_prefix(state, RENAMES))
        config = architecture(state, source_config)
        config.update(
            region_embedding="visualbert",
            region_location_dim=0,
            region_token_type=0,
            region_feature_dim=state["bert.region_embeddings.feature_proj.weight"].shape[1],
            num_region_classes=0,
        )
        if "classifier.weight" in state:
            config["num_labels"] = state["classifier.weight"].shape[0]
        return Converted(config, state, model_class, task)


def _head_from_keys(state, architectures: list) -> str:
    """The head the keys name where only one fits; a bare ``cls`` classifier is VQA's or NLVR2's (a 2-answer
    VQA head has NLVR2's shape), so config.json's ``architectures`` must say which."""
    if any(k.startswith("cls.predictions.") for k in state):
        return "VisualBertForPreTraining"
    if "cls.weight" in state:
        raise ValueError(
            f"config.json's architectures ({architectures or 'none'}) name no VisualBERT head, and the "
            "keys (a cls classifier) fit VisualBertForQuestionAnswering and VisualBertForVisualReasoning: "
            'add "architectures": ["VisualBertForQuestionAnswering"] (or ...ForVisualReasoning) to '
            "config.json, as transformers writes it"
        )
    return "VisualBertModel"


VISUALBERT = VisualBertFamily(
    name="visualbert",
    region_embedding="visualbert",
    tokenizer="bert-base-uncased",
    cased=False,
    features={
        "extractor": "detectron-fc6",
        "fingerprint": None,
        "config": None,
        "max_regions": 100,
        "description": "Detectron (v1) Faster R-CNN fc6 features: 2048-d, 100 boxes (VQA / COCO checkpoints, "
        "Pythia detectron_fix_100); 1024-d (NLVR2); import them as region shards",
    },
    max_text_length=128,
    config_fields=("num_attention_heads",),
    reference="huggingface/transformers modeling_visual_bert.py@00e12e7",
    parity=(
        "hidden states and every head's logits equal transformers' VisualBert models within 1e-5 (vlbert "
        "tests/published/test_published_checkpoints.py)"
    ),
)

__all__ = ["VISUALBERT", "VisualBertFamily"]
