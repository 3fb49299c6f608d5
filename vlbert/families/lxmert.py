"""LXMERT (Tan and Bansal 2019) as transformers ports it (``modeling_lxmert.py``; hub names
``unc-nlp/lxmert-base-uncased``, ``unc-nlp/lxmert-vqa-uncased`` (3129 answers), ``unc-nlp/lxmert-gqa-uncased``
(1842 answers)): a ``save_pretrained`` directory of ``LxmertModel``, ``LxmertForPreTraining`` or
``LxmertForQuestionAnswering`` (``config.json`` with model_type ``lxmert``); and airsplay/lxmert's own ``.pth`` files
(``Epoch20_LXRT.pth``: ``torch.save(model.state_dict())`` of the ``nn.DataParallel``-wrapped ``LXRTPretraining``, so
every key starts ``module.`` and the backbone is ``module.bert.``; airsplay/lxmert@2249f65
``src/pretrain/lxmert_pretrain.py``, keys of ``src/lxrt/modeling.py``@827087b, which transformers kept), and its
fine-tuned ``BEST.pth`` (``lxrt_encoder.model.bert.*`` + ``logit_fc.*``, ``src/tasks/{vqa,gqa}_model.py``: the
VQA / GQA answer head).

Keys -> ours (``bert.encoder`` is :class:`~vlbert.models.two_stream.TwoStreamEncoder`):

| LXMERT | vlbert |
|---|---|
| ``lxmert.embeddings.*``, ``lxmert.pooler.*`` | ``bert.embeddings.*``, ``bert.pooler.*`` |
| ``lxmert.encoder.visn_fc.{visn_fc,visn_layer_norm,box_fc,box_layer_norm}`` | ``bert.region_embeddings.{feature_proj,feature_norm,location_proj,location_norm}`` |
| ``lxmert.encoder.layer.{i}.*`` (BERT layer names) | ``bert.encoder.text.layers.{i}.*`` (q/k/v fused) |
| ``lxmert.encoder.r_layers.{i}.*`` | ``bert.encoder.regions.layers.{i}.*`` |
| ``lxmert.encoder.x_layers.{i}.visual_attention.att.{query,key,value}`` / ``.output.{dense,LayerNorm}`` | ``bert.encoder.cross_layers.{i}.cross_attention.{query,kv (key ; value)}`` / ``{out,norm}`` |
| ``x_layers.{i}.lang_self_att``, ``lang_inter``, ``lang_output`` (``visn_*``) | ``cross_layers.{i}.text_layer`` (``region_layer``) as a BERT layer |
| ``cls.predictions.*`` (decoder tied to the word embeddings) | ``masked_lm.*`` |
| ``cls.seq_relationship`` (1 = the sentence matches the image) | ``itm`` |
| ``obj_predict_head.transform`` + ``decoder_dict.obj`` / ``attr`` / ``feat`` | ``mrc`` / ``attr`` / ``mrfr`` (``dense``, ``norm``, ``decoder``): the shared transform copied into each |
| ``answer_head.logit_fc.{0,2,3}`` (``LxmertForPreTraining``) | ``qa.{0,2,3}`` (the ``qa`` unit) |
| ``answer_head.logit_fc.{0,2,3}`` (``LxmertForQuestionAnswering``) | ``vqa_head.{0,2,3}`` of :class:`~vlbert.models.vqa.VLBertForVQA` |

LXMERT's object head shares one transform among its three decoders; ours keeps one per unit, so the converted
copies compute LXMERT's outputs exactly and drift apart only if pretraining continues. Tokenizer:
bert-base-uncased. Features: BUTD Caffe ResNet-101 on Visual Genome, exactly 36 boxes per image (LXMERT's
``*_obj36.tsv``), which our ``butd`` backend gives with ``--min-boxes 36 --max-boxes 36``.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from vlbert.checkpoint import hf_to_vlbert
from vlbert.families.base import (
    CheckpointFamily,
    Converted,
    detector_features,
    load_torch_file,
    read_directory,
    to_float32,
)
from vlbert.families.uniter import BUTD_VG

#: the features LXMERT's checkpoints were trained on: butd-vg at exactly 36 boxes (``*_obj36.tsv``).
BUTD_VG_36 = BUTD_VG.with_options(min_boxes=36, max_boxes=36)

_LAYER_PARTS = {
    "self_att.self.": "attention.self.",
    "self_att.output.": "attention.output.",
    "inter.": "intermediate.",
    "output.": "output.",
}


def _bert_layers(state: dict, source: str, target: str) -> dict:
    """Every ``{source}{i}.<BERT layer key>`` of ``state`` as ``{target}{i}.<our key>`` (q/k/v fused through
    :func:`vlbert.checkpoint.hf_to_vlbert`)."""
    group = {"encoder.layer." + k[len(source) :]: v for k, v in state.items() if k.startswith(source)}
    return {target + k[len("bert.encoder.layers.") :]: v for k, v in hf_to_vlbert(group).items()}


def _cross_layers(state: dict, out: dict) -> None:
    """The ``lxmert.encoder.x_layers.{i}.*`` keys of ``state`` into ``out`` in our names."""
    indices = sorted({int(m.group(1)) for k in state if (m := re.match(r"lxmert\.encoder\.x_layers\.(\d+)\.", k))})
    for i in indices:
        src, dst = f"lxmert.encoder.x_layers.{i}.", f"bert.encoder.cross_layers.{i}."
        for stream, ours in (("lang_", "text_layer"), ("visn_", "region_layer")):
            renamed = {}
            for k, v in state.items():
                if k.startswith(src + stream):
                    rest = k[len(src + stream) :]
                    part = next((p for p in _LAYER_PARTS if rest.startswith(p)), None)
                    if part is None:
                        raise ValueError(
                            f"tensor {k!r} is not part of LXMERT's layout (a cross-modality layer's "
                            f"{stream}* tensors are {', '.join(stream + p + '*' for p in _LAYER_PARTS)})"
                        )
                    renamed["x.0." + _LAYER_PARTS[part] + rest[len(part) :]] = v
            out.update({f"{dst}{ours}." + k[len("x.0.") :]: v for k, v in _bert_layers(renamed, "x.", "x.").items()})
        att = src + "visual_attention."
        for param in ("weight", "bias"):
            out[f"{dst}cross_attention.query.{param}"] = state[f"{att}att.query.{param}"]
            out[f"{dst}cross_attention.kv.{param}"] = torch.cat(
                [state[f"{att}att.key.{param}"], state[f"{att}att.value.{param}"]]
            )
            out[f"{dst}cross_attention.out.{param}"] = state[f"{att}output.dense.{param}"]
            out[f"{dst}cross_attention.norm.{param}"] = state[f"{att}output.LayerNorm.{param}"]


_REGION = {
    "visn_fc": "feature_proj",
    "visn_layer_norm": "feature_norm",
    "box_fc": "location_proj",
    "box_layer_norm": "location_norm",
}
_VISUAL_DECODERS = {"obj": "mrc", "attr": "attr", "feat": "mrfr"}


def _heads(state: dict, out: dict, question_answering: bool) -> None:
    """The heads of ``state`` (transformers / airsplay names) into ``out`` in our names."""
    for k, v in state.items():
        if k.startswith("cls.predictions.") and not k.startswith("cls.predictions.decoder."):
            out.update(hf_to_vlbert({k: v}))
        elif k.startswith("cls.seq_relationship."):
            out["itm." + k.rsplit(".", 1)[1]] = v
        elif k.startswith("answer_head.logit_fc."):
            out[("vqa_head." if question_answering else "qa.") + k[len("answer_head.logit_fc.") :]] = v
        elif k.startswith("obj_predict_head.decoder_dict."):
            name, _, param = k[len("obj_predict_head.decoder_dict.") :].partition(".")
            head = _VISUAL_DECODERS.get(name)
            if head is None:
                raise ValueError(
                    f"tensor {k!r} is not part of LXMERT's layout (its object head decodes "
                    f"{', '.join(_VISUAL_DECODERS)})"
                )
            out[f"{head}.decoder.{param}"] = v
            for ours, theirs in (("dense", "dense"), ("norm", "LayerNorm")):
                for p in ("weight", "bias"):
                    out[f"{head}.{ours}.{p}"] = state[f"obj_predict_head.transform.{theirs}.{p}"]


#: the key prefixes of LXMERT's layout (transformers' names); a tensor under none is not LXMERT's.
LAYOUT = (
    "lxmert.embeddings.",
    "lxmert.pooler.",
    "lxmert.encoder.visn_fc.",
    "lxmert.encoder.layer.",
    "lxmert.encoder.r_layers.",
    "lxmert.encoder.x_layers.",
    "cls.predictions.",
    "cls.seq_relationship.",
    "answer_head.logit_fc.",
    "obj_predict_head.transform.",
    "obj_predict_head.decoder_dict.",
)


def convert_lxmert_state(state: dict, question_answering: bool) -> dict:
    """An LXMERT state dict (``lxmert.``-prefixed backbone, transformers' head names) in our names: the table of the
    module docstring.

    Raises:
        KeyError: a tensor of the layout that the state lacks (a cross-attention or object-head tensor; named).
        ValueError: a tensor outside LXMERT's layout (named).
    """
    foreign = sorted(k for k in state if not k.startswith(LAYOUT))
    if foreign:
        raise ValueError(
            f"tensor {foreign[0]!r}{f' (and {len(foreign) - 1} more)' if len(foreign) > 1 else ''} is "
            f"not part of LXMERT's layout (its keys start {', '.join(p + '*' for p in LAYOUT)})"
        )
    out = {}
    for k, v in state.items():
        if k.startswith(("lxmert.embeddings.", "lxmert.pooler.")):
            out.update(hf_to_vlbert({"bert." + k[len("lxmert.") :]: v}))
        elif k.startswith("lxmert.encoder.visn_fc."):
            module, param = k[len("lxmert.encoder.visn_fc.") :].split(".")
            out[f"bert.region_embeddings.{_REGION[module]}.{param}"] = v
    out.update(_bert_layers(state, "lxmert.encoder.layer.", "bert.encoder.text.layers."))
    out.update(_bert_layers(state, "lxmert.encoder.r_layers.", "bert.encoder.regions.layers."))
    _cross_layers(state, out)
    _heads(state, out, question_answering)
    return out


def _count(state: dict, group: str) -> int:
    found = [int(m.group(1)) for k in state if (m := re.match(rf"lxmert\.encoder\.{group}\.(\d+)\.", k))]
    return 1 + max(found) if found else 0


class LxmertFamily(CheckpointFamily):
    """transformers LXMERT directories and airsplay/lxmert ``.pth`` files (see the module docstring)."""

    def read(self, source: Path):
        if source.is_file():
            state = load_torch_file(source)
            config = {}
        else:
            state, config = read_directory(source, "an LXMERT checkpoint (transformers' save_pretrained)")
        return self.normalise(state), config

    def normalise(self, state):
        if any(k.startswith("module.") or ".module." in k for k in state):  # nn.DataParallel's (airsplay/lxmert)
            state = {k.removeprefix("module.").replace(".module.", "."): v for k, v in state.items()}
        if any(k.startswith("lxrt_encoder.model.bert.") for k in state):  # airsplay's fine-tuned tasks/<task>_model.py
            state = {
                "bert." + k[len("lxrt_encoder.model.bert.") :]
                if k.startswith("lxrt_encoder.model.bert.")
                else "answer_head." + k
                if k.startswith("logit_fc.")
                else k: v
                for k, v in state.items()
            }
        if any(k.startswith("bert.encoder.visn_fc.") for k in state):  # airsplay's LXRTPretraining: backbone "bert."
            state = {"lxmert." + k[len("bert.") :] if k.startswith("bert.") else k: v for k, v in state.items()}
        if "encoder.visn_fc.visn_fc.weight" in state:  # a bare LxmertModel saves no prefix
            state = {"lxmert." + k: v for k, v in state.items()}
        return state

    def matches(self, state) -> bool:
        return any(k.startswith("lxmert.encoder.visn_fc.") for k in state)

    def source_key(self, key: str) -> str:
        return "lxmert." + key[len("bert.") :] if key.startswith(("bert.embeddings.", "bert.pooler.")) else key

    def convert(self, state, source_config) -> Converted:
        state = to_float32({k: v for k, v in state.items() if not k.endswith("position_ids")})
        heads = {a for a in source_config.get("architectures") or []}
        qa = "LxmertForQuestionAnswering" in heads or (  # an answer head without pretraining heads: fine-tuned
            "answer_head.logit_fc.3.weight" in state and not any(k.startswith("cls.") for k in state)
        )
        converted = convert_lxmert_state(state, qa)
        words = converted["bert.embeddings.word_embeddings.weight"]
        hidden = words.shape[1]
        config = {
            "vocab_size": words.shape[0],
            "hidden_size": hidden,
            "num_attention_heads": int(source_config.get("num_attention_heads", max(1, hidden // 64))),
            "intermediate_size": converted["bert.encoder.cross_layers.0.text_layer.ffn_in.weight"].shape[0],
            "max_position_embeddings": converted["bert.embeddings.position_embeddings.weight"].shape[0],
            "type_vocab_size": converted["bert.embeddings.token_type_embeddings.weight"].shape[0],
            "hidden_act": source_config.get("hidden_act", "gelu"),
            "layer_norm_eps": 1e-12,
            "encoder": "two-stream",
            "l_layers": _count(state, "layer"),
            "r_layers": _count(state, "r_layers"),
            "x_layers": _count(state, "x_layers"),
            "region_embedding": "lxmert",
            "region_location_dim": 4,
            "region_feature_dim": converted["bert.region_embeddings.feature_proj.weight"].shape[1],
            "num_region_classes": converted["mrc.decoder.weight"].shape[0]
            if "mrc.decoder.weight" in converted
            else int(source_config.get("num_object_labels", 1600)),
            "num_attribute_classes": converted["attr.decoder.weight"].shape[0]
            if "attr.decoder.weight" in converted
            else int(source_config.get("num_attr_labels", 400)),
        }
        config["num_hidden_layers"] = config["l_layers"] + config["x_layers"]
        dropped = (
            {"cls.predictions.decoder.weight": "tied to the word embeddings"}
            if "cls.predictions.decoder.weight" in state
            else {}
        )
        if qa:
            config["num_labels"] = converted["vqa_head.3.weight"].shape[0]
            return Converted(config, converted, "VLBertForVQA", "vqa", dropped=dropped)
        if "qa.3.weight" in converted:
            config["num_qa_labels"] = converted["qa.3.weight"].shape[0]
        return Converted(config, converted, "VLBertForPreTraining", "vl-pretraining", dropped=dropped)


LXMERT = LxmertFamily(
    name="lxmert",
    region_embedding="lxmert",
    tokenizer="bert-base-uncased",
    cased=False,
    features=detector_features(
        BUTD_VG_36,
        36,
        "bottom-up-attention Faster R-CNN ResNet-101 (Visual Genome, Caffe), "
        "exactly 36 boxes per image (LXMERT's *_obj36.tsv), 2048-d pool5 + 4-d box (x1, y1, x2, "
        "y2) / (w, h)",
    ),
    max_text_length=20,
    config_fields=("num_attention_heads",),
    reference="airsplay/lxmert@827087b; huggingface/transformers modeling_lxmert.py (5.23)",
    parity=(
        "language, vision and pooled outputs and every head's logits equal transformers' Lxmert models within "
        "1e-5 (float32, ragged text and regions; vlbert tests/published/test_lxmert.py)"
    ),
)

__all__ = ["LXMERT", "LxmertFamily", "BUTD_VG_36", "convert_lxmert_state"]
