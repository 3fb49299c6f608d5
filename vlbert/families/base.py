"""What a published checkpoint family is: how its files are read, how its keys map onto ours, which tokenizer and
which region features its weights were trained with.

A family turns a published checkpoint into a :class:`Converted`: our config values, a state dict in our parameter
names, the model class that holds those heads, and what inference needs (labels, lengths, the features'
provenance). :func:`vlbert.families.convert.convert_checkpoint` builds the model from it, loads it strictly and
writes a normal vlbert model directory.
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from vlbert.checkpoint import PYTORCH_WEIGHTS_NAME, SHARDED_INDEX_NAME, WEIGHTS_NAME, read_state_dict
from vlbert.common.user_files import expect, read_json

logger = logging.getLogger(__name__)


@dataclass
class Converted:
    """A published checkpoint in our terms.

    Attributes:
        config: VLBertConfig field values (the architecture read from the checkpoint).
        state: tensors under our parameter names (float32).
        model_class: the name of the :mod:`vlbert.models` class whose parameters ``state`` fills.
        task: the processor record's task of the result ("vl-pretraining", "vqa", "snli-ve", "retrieval", "nlvr2").
        dropped: source keys deliberately not carried over (and why), reported by the converter.
        labels: the head's label names in output order where the family fixes them (UNITER's SNLI-VE order), else
            None (``--labels`` names them).
        info: further processor record fields for the task (a retrieval checkpoint's ``shortlist``).
    """

    config: dict[str, Any]
    state: dict[str, torch.Tensor]
    model_class: str
    task: str
    dropped: dict[str, str] = field(default_factory=dict)
    labels: list[str] | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointFamily:
    """One published family: its name, the region pathway its weights need, its tokenizer and its features.

    Attributes:
        name: the family's key in :data:`vlbert.families.FAMILIES` (``--from`` of vlbert convert).
        region_embedding: the key of :data:`vlbert.models.region_embeddings.REGION_EMBEDDINGS` it uses.
        tokenizer: the hub name of the tokenizer it was trained with.
        cased: whether that tokenizer keeps case (a tokenizer that lower-cases is refused for a cased family).
        features: what its regions were: ``extractor`` (a description, or the name our backend writes when one
            reproduces them), ``fingerprint`` / ``config`` of our :class:`vlbert.detectors.config.DetectorConfig` that
            reproduces them, with what is known of the published weights (their file name; ``weights_sha256``
            where published), so regions match on the hash where both records have one, else on the file name
            (None where no config reproduces them: then the regions must be imported), ``max_regions``.
        max_text_length: the text length its data used.
        reference: the reference code it is converted from, ``owner/repo@commit`` (the model card cites it).
        parity: how far the converted model is from that code's forward (the model card cites it).
        config_fields: the keys of the source's own config a conversion cannot do without (what the tensors do not
            show: a transformers directory's ``num_attention_heads``); a directory source without them is refused
            (a family's own single-file format, airsplay's ``.pth``, has no config: its head size is the family's).
    """

    name: str
    region_embedding: str
    tokenizer: str
    cased: bool
    features: dict[str, Any]
    max_text_length: int = 60
    reference: str = ""
    parity: str = ""
    config_fields: tuple[str, ...] = ()

    def read(self, source: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The checkpoint's tensors, in one key layout whatever the published form (:meth:`normalise`), and its own
        config (a dict; empty where the format has none). Files go through :func:`load_torch_object`, the one
        loader of pickled tensors.

        Raises:
            WrongForm: a directory where the family publishes a file, or the reverse.
        """
        raise NotImplementedError

    def normalise(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state``'s keys as :meth:`matches` and :meth:`convert` read them, from any of the family's published
        layouts (prefixes of ``nn.DataParallel``, of a bare model, of another release); the default changes
        nothing."""
        return state

    def matches(self, state: dict[str, torch.Tensor]) -> bool:
        """Whether ``state`` (after :meth:`normalise`) has this family's key layout."""
        raise NotImplementedError

    def source_key(self, key: str) -> str:
        """The family's own name of ``key`` (a name of :meth:`convert`'s output), for naming a tensor the file
        lacks; the default: ``key`` unchanged."""
        return key

    def convert(self, state: dict[str, torch.Tensor], source_config: dict[str, Any]) -> Converted:
        """The checkpoint in our terms (see :class:`Converted`)."""
        raise NotImplementedError


def detector_features(detector, max_regions: int, description: str) -> dict[str, Any]:
    """A family's ``features`` for regions of one of our BUTD detectors (a
    :class:`~vlbert.detectors.config.DetectorConfig`): the name that backend writes into its regions, the fingerprint, the
    configuration record, ``max_regions`` and ``description``, all derived from the one config."""
    return {
        "extractor": detector.options.extractor_name(detector.weights),
        "fingerprint": detector.fingerprint(),
        "config": asdict(detector),
        "max_regions": max_regions,
        "description": description,
    }


class WrongForm(ValueError):
    """A source of the wrong form for a family's reader: a directory where the family publishes one file, or the
    reverse (:func:`vlbert.families.convert.convert_checkpoint` then names the family the source is)."""


def load_torch_object(path: Path, what: str = "state dict of tensors"):
    """The one loader of every family's ``torch.save`` files (UNITER's ``.pt``, airsplay's ``.pth``, VL-BERT's
    ``.model``, a directory's ``pytorch_model.bin``): ``torch.load(weights_only=True)`` onto the CPU, tensors and
    plain containers only, never code.

    Raises:
        FileNotFoundError: no such file.
        ValueError: whatever the unpickler raises (``UnpicklingError``, and on damaged bytes ``IndexError``,
            ``KeyError``, ``EOFError``, ``RuntimeError``, ...): one message naming the file and ``what`` it should
            hold, the cause's first line, and both fixes (a damaged copy fetched again; code or objects re-saved).
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - the unpickler raises many types (IndexError, KeyError, ...) on bad bytes
        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(
            f"{path} is not a plain {what} ({type(e).__name__}: {first[:200]}): either the file is "
            "damaged (cut off by a copy or download: fetch it again), or it holds code or objects, and "
            "vlbert never unpickles code or objects: re-save it as tensors "
            "(torch.save(model.state_dict())) with code you trust"
        ) from e


def load_torch_file(path: Path) -> dict[str, torch.Tensor]:
    """A ``.pt`` / ``.bin`` state dict read by :func:`load_torch_object`. A ``{"model_state": {...}}`` /
    ``{"state_dict": {...}}`` wrapper is unwrapped.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is damaged or holds anything but tensors (pickled code or objects: the file is named
            and refused), or no state dict.
    """
    state = load_torch_object(path)
    for wrapper in ("model_state", "state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} does not hold a state dict (parameter name -> tensor)")
    return state


def read_directory(source: Path, what: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A ``save_pretrained``-style checkpoint directory: its tensors (:func:`vlbert.checkpoint.read_state_dict`:
    safetensors, or ``pytorch_model.bin`` read without unpickling code) and its ``config.json`` (empty if none).

    Raises:
        WrongForm: ``source`` is a file (``what`` names the family's format). Errors of ``read_state_dict`` and
            :func:`load_torch_file` (``pytorch_model.bin``).
    """
    if not source.is_dir():
        raise WrongForm(f"{source} is a file; {what} is a directory (config.json + weights)")
    config_file = source / "config.json"
    config = read_json(config_file, f"{what}'s config.json") if config_file.is_file() else {}
    only_bin = not any((source / name).is_file() for name in (WEIGHTS_NAME, SHARDED_INDEX_NAME))
    state = (
        load_torch_file(source / PYTORCH_WEIGHTS_NAME)
        if only_bin and (source / PYTORCH_WEIGHTS_NAME).is_file()
        else read_state_dict(source)
    )
    return state, expect(config, dict, str(config_file), "config.json")


def to_float32(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Floating tensors upcast to float32 (published checkpoints are often float16); others unchanged."""
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def take_tied(state: dict[str, torch.Tensor], duplicate: str, original: str, transpose: bool = False) -> None:
    """Drop ``duplicate``, a tied copy of ``original`` (``state_dict`` lists tied parameters under both names),
    after checking it equals ``original`` (transposed where the tie is through ``.t()``).

    Raises:
        ValueError: the two differ: the file is not what the family's code writes.
    """
    if duplicate not in state or original not in state:
        state.pop(duplicate, None)
        return
    copy = state.pop(duplicate)
    expected = state[original].t() if transpose else state[original]
    if copy.shape != expected.shape or not torch.equal(copy, expected):
        raise ValueError(
            f"{duplicate} should be tied to {original} but holds other values; this checkpoint was "
            "not written by the family's own code"
        )


def source_prefix(key: str, table: dict[str, str]) -> str:
    """``key`` with :func:`rename_prefix`'s renames of ``table`` undone (in reverse order): the source's name of a
    renamed key; unchanged where no rename produced it."""
    for old, new in reversed(table.items()):
        if key.startswith(new):
            key = old + key[len(new) :]
    return key


def rename_prefix(state: dict[str, torch.Tensor], table: dict[str, str]) -> dict[str, torch.Tensor]:
    """Each key gets the prefix renames of ``table`` applied in the table's order (a later entry sees the result
    of an earlier one: ``{"uniter.": "bert.", "bert.img_embeddings.": ...}``); keys no entry matches stay."""
    out = {}
    for key, value in state.items():
        for old, new in table.items():
            if key.startswith(old):
                key = new + key[len(old) :]
        out[key] = value
    return out


def architecture(state: dict[str, torch.Tensor], source_config: dict) -> dict:
    """BERT config values read from a converted state dict's shapes (``bert.*`` keys in our names); the source's
    own config (e.g. UNITER's ``config/uniter-base.json``) decides the head count where it gives one, else head
    size 64 (BERT-base and -large, UNITER-base and -large)."""
    words = state["bert.embeddings.word_embeddings.weight"]
    hidden = words.shape[1]
    layers = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"bert\.encoder\.layers\.(\d+)\.", k)))
    values = {
        "vocab_size": words.shape[0],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": int(source_config.get("num_attention_heads", max(1, hidden // 64))),
        "intermediate_size": state["bert.encoder.layers.0.ffn_in.weight"].shape[0],
        "max_position_embeddings": state["bert.embeddings.position_embeddings.weight"].shape[0],
        "type_vocab_size": state["bert.embeddings.token_type_embeddings.weight"].shape[0],
        "hidden_act": source_config.get("hidden_act", "gelu"),
        "layer_norm_eps": float(source_config.get("layer_norm_eps", 1e-12)),
    }
    return values


__all__ = [
    "CheckpointFamily",
    "Converted",
    "WrongForm",
    "detector_features",
    "load_torch_object",
    "load_torch_file",
    "read_directory",
    "to_float32",
    "take_tied",
    "rename_prefix",
    "source_prefix",
    "architecture",
]
