"""The key map between transformers' ModernBERT checkpoints and this library's ModernBERT parameter names.

transformers' names (``models/modernbert/modeling_modernbert.py`` at v5.24.0, the same at v5.17.0): the encoder
under ``model.`` (``embeddings.tok_embeddings``, ``embeddings.norm``, ``layers.{i}.attn_norm`` (none in layer 0),
``layers.{i}.attn.Wqkv``, ``layers.{i}.attn.Wo``, ``layers.{i}.mlp_norm``, ``layers.{i}.mlp.Wi``,
``layers.{i}.mlp.Wo``, ``final_norm``), the prediction head ``head.dense`` / ``head.norm``, the MLM output bias
``decoder.bias`` (its weight is the tied word embedding matrix) and the task heads' ``classifier``. Ours keep the
encoder under ``bert.`` with BERT's module names (:mod:`vlbert.checkpoint`), so the library's text-encoder code reads
either architecture the same way.
"""

from __future__ import annotations

import re

import torch

# (ours inside the encoder, transformers' inside ``model.``); "{i}" is a layer index, ".weight"/".bias" follow.
ENCODER_NAMES = [
    ("embeddings.word_embeddings", "embeddings.tok_embeddings"),
    ("embeddings.norm", "embeddings.norm"),
    ("encoder.layers.{i}.attention_norm", "layers.{i}.attn_norm"),
    ("encoder.layers.{i}.attention.qkv", "layers.{i}.attn.Wqkv"),
    ("encoder.layers.{i}.attention.out", "layers.{i}.attn.Wo"),
    ("encoder.layers.{i}.ffn_norm", "layers.{i}.mlp_norm"),
    ("encoder.layers.{i}.ffn_in", "layers.{i}.mlp.Wi"),
    ("encoder.layers.{i}.ffn_out", "layers.{i}.mlp.Wo"),
    ("encoder.final_norm", "final_norm"),
]
#: The MLM output bias: ours is the head's ``bias`` (the head owns the tied projection, as BERT's), theirs the
#: decoder's.
DECODER_BIAS = ("head.bias", "decoder.bias")
#: transformers' tied decoder weight (the word embeddings again): not read, not written.
TIED_KEY = "decoder.weight"
_ENCODER_TOP = ("embeddings.", "layers.", "final_norm.")


def _pattern(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)") + r"\.(?P<param>\w+)$")


_FROM_HF = [(_pattern(theirs), ours) for ours, theirs in ENCODER_NAMES]
_TO_HF = [(_pattern(ours), theirs) for ours, theirs in ENCODER_NAMES]


def _rename(key: str, table) -> str | None:
    for pattern, template in table:
        m = pattern.match(key)
        if m:
            return template.replace("{i}", m.groupdict().get("i") or "") + "." + m.group("param")
    return None


def modernbert_from_hf(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformers ModernBERT state dict (``ModernBertModel``'s keys, or a model with heads: encoder under
    ``model.``) in our names: the encoder under ``bert.``, ``decoder.bias`` as ``head.bias``, the tied
    ``decoder.weight`` dropped, other keys (``head.*``, ``classifier.*``) unchanged.

    Raises:
        ValueError: the state holds learned absolute position embeddings (a BERT checkpoint: ModernBERT's
            positions are rotary), named with the fix."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        if "position_embeddings" in key:
            raise ValueError(
                f"the checkpoint holds {key}: it was trained with learned absolute positions, which ModernBERT's "
                "rotary layers cannot use; load it with vlbert.BertModel / BertForPreTraining instead"
            )
        if key == TIED_KEY:
            continue
        inner = key.removeprefix("model.")
        if inner.startswith(_ENCODER_TOP) and (ours := _rename(inner, _FROM_HF)) is not None:
            out["bert." + ours] = tensor
        elif key == DECODER_BIAS[1]:
            out[DECODER_BIAS[0]] = tensor
        else:
            out[key] = tensor
    return out


def modernbert_to_hf(state_dict: dict[str, torch.Tensor], base_prefix: str = "bert") -> dict[str, torch.Tensor]:
    """Inverse of :func:`modernbert_from_hf`: our names -> transformers' (``model.`` before the encoder of a model
    with heads; none for a bare encoder, ``base_prefix`` "", as transformers saves ``ModernBertModel``). The tied
    decoder weight is not written (transformers ties it on load)."""
    prefix = base_prefix + "." if base_prefix else ""
    hf_prefix = "model." if base_prefix else ""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        if key.startswith(prefix) and (theirs := _rename(key[len(prefix) :], _TO_HF)) is not None:
            out[hf_prefix + theirs] = tensor
        elif key == DECODER_BIAS[0]:
            out[DECODER_BIAS[1]] = tensor
        else:
            out[key] = tensor
    return out


#: A vision-language model's own tensors beside a ModernBERT tower, kept as they are in both directions (the region
#: pathway, VisualBERT's ``position_embeddings`` among them, and the regions' modality table).
_VL_OWN = ("bert.region_embeddings.", "bert.embeddings.token_type_embeddings.")
#: ModernBERT's prediction head -> a vision-language model's masked-LM head (BERT's MaskedLMHead: the same dense,
#: activation, norm and tied projection plus bias; its dense and norm biases, which ModernBERT has not, start at 0).
_MLM_HEAD = (("head.dense.", "masked_lm.dense."), ("head.norm.", "masked_lm.norm."), ("head.bias", "masked_lm.bias"))


def modernbert_vl_from_hf(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A vision-language state dict whose text tower is ModernBERT, or a transformers ModernBERT checkpoint to start
    one from, in our names (encoder under ``bert.``, also for a bare encoder's keys): the tower as
    :func:`modernbert_from_hf`, the region pathway and the regions' modality table unchanged, and a ``ModernBertForMaskedLM``'s prediction head as the masked-LM head (``masked_lm.*``).

    Raises:
        ValueError: as :func:`modernbert_from_hf` (a BERT checkpoint's learned positions in the tower)."""
    if any(k.startswith("embeddings.tok_embeddings.") for k in state_dict):  # a bare encoder's (no prefix)
        state_dict = {("model." if k.startswith(_ENCODER_TOP) else "bert.") + k: v for k, v in state_dict.items()}
    own = {k: v for k, v in state_dict.items() if k.startswith(_VL_OWN)}
    out = modernbert_from_hf({k: v for k, v in state_dict.items() if k not in own})
    for theirs, ours in _MLM_HEAD:
        out = {ours + k[len(theirs) :] if k.startswith(theirs) else k: v for k, v in out.items()}
    return {**out, **own}


def modernbert_vl_to_hf(state_dict: dict[str, torch.Tensor], base_prefix: str = "bert") -> dict[str, torch.Tensor]:
    """Inverse of :func:`modernbert_vl_from_hf` for a vision-language model's own state: the tower under
    transformers' ModernBERT names (``model.``), everything else (region pathway, pooler, heads) under ours."""
    prefix = base_prefix + "." if base_prefix else ""
    own = {k: v for k, v in state_dict.items() if k.startswith(tuple(prefix + p[5:] for p in _VL_OWN))}
    return {**modernbert_to_hf({k: v for k, v in state_dict.items() if k not in own}, base_prefix), **own}


__all__ = ["modernbert_from_hf", "modernbert_to_hf", "modernbert_vl_from_hf", "modernbert_vl_to_hf", "ENCODER_NAMES"]
