"""Oscar and VinVL (Li et al. 2020; Zhang et al. 2021; microsoft/Oscar at 266075f, ``oscar/modeling/
modeling_bert.py`` ``BertImgModel``): pytorch-transformers ``save_pretrained`` directories (``config.json`` +
``pytorch_model.bin``) with the encoder under ``bert.``.

Keys -> ours:

| Oscar / VinVL | vlbert |
|---|---|
| ``bert.embeddings.*``, ``bert.encoder.*``, ``bert.pooler.*`` | ``bert.*`` |
| ``bert.img_embedding`` (Linear over the 2054-d [feature ; box6] input) | ``bert.region_embeddings.proj`` |
| ``bert.LayerNorm`` (VinVL, ``use_img_layernorm``) | ``bert.region_embeddings.norm`` (``region_embedding: vinvl``) |
| ``cls.predictions.*`` | ``masked_lm.*`` |
| ``cls.seq_relationship`` (2 classes, 0 = the caption matches, BERT's convention) | ``itm`` with its rows swapped |

Not carried over, and reported: VinVL's 3-way contrastive ``cls.seq_relationship`` (matched / polluted caption /
polluted answer: not the ITM head's function) and the fine-tuned ``classifier.*`` heads (Oscar's own
linear/MLP forms). Image tokens have no type or position embedding; the 6-d box is [x1, y1, x2, y2, w, h]
normalised. Tokenizer: bert-base-uncased. Features: Oscar's BUTD-style Faster R-CNN and VinVL's X152-C4
(``vinvl_vg_x152c4``) have no backend here: a converted Oscar/VinVL takes imported regions (VinVL's TSV features).
"""

from __future__ import annotations

from pathlib import Path

from vlbert.checkpoint import hf_to_vlbert
from vlbert.families.base import CheckpointFamily, Converted, architecture, read_directory, rename_prefix, to_float32

RENAMES = {"bert.img_embedding.": "bert.region_embeddings.proj.", "bert.LayerNorm.": "bert.region_embeddings.norm."}


class OscarFamily(CheckpointFamily):
    """Oscar / VinVL checkpoints (see the module docstring for the key map)."""

    def read(self, source: Path):
        return read_directory(source, "an Oscar/VinVL checkpoint")

    def matches(self, state) -> bool:
        return "bert.img_embedding.weight" in state

    def convert(self, state, source_config) -> Converted:
        state = to_float32({k: v for k, v in state.items() if not k.endswith("position_ids")})
        state.pop("cls.predictions.decoder.weight", None)  # tied to the word embeddings
        dropped = {}
        relation = state.pop("cls.seq_relationship.weight", None), state.pop("cls.seq_relationship.bias", None)
        if relation[0] is not None and relation[0].shape[0] == 2:
            state["itm.weight"], state["itm.bias"] = relation[0].flip(0), relation[1].flip(0)
        elif relation[0] is not None:
            dropped["cls.seq_relationship"] = (
                f"{relation[0].shape[0]}-way contrastive head (VinVL), not image-text matching"
            )
        for key in [k for k in state if k.startswith("classifier.")]:
            state.pop(key)
            dropped["classifier"] = "Oscar's fine-tuned classifier: fine-tune a vlbert head from the backbone"
        state = hf_to_vlbert(rename_prefix(state, RENAMES))
        config = architecture(state, source_config)
        vinvl = "bert.region_embeddings.norm.weight" in state
        config.update(
            region_embedding="vinvl" if vinvl else "oscar",
            region_location_dim=6,
            num_region_classes=0,
            region_feature_dim=state["bert.region_embeddings.proj.weight"].shape[1] - 6,
        )
        return Converted(config, state, "VLBertForPreTraining", "vl-pretraining", dropped)


OSCAR = OscarFamily(
    name="oscar",
    region_embedding="oscar",
    tokenizer="bert-base-uncased",
    cased=False,
    features={
        "extractor": "oscar-vinvl-features",
        "fingerprint": None,
        "config": None,
        "max_regions": 50,
        "description": "Oscar: bottom-up-attention Faster R-CNN (Visual Genome) 2048-d + 6-d box; VinVL: the "
        "VinVL X152-C4 detector (vinvl_vg_x152c4) 2048-d + 6-d box; import its TSV features",
    },
    max_text_length=70,
    config_fields=("num_attention_heads",),
    reference="microsoft/Oscar@266075f",
    parity=(
        "hidden states and pooled output equal a reference forward written from BertImgModel within 1e-5 "
        "(vlbert tests/published/test_published_checkpoints.py)"
    ),
)

__all__ = ["OSCAR", "OscarFamily"]
