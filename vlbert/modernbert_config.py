"""ModernBERT's model configuration, field for field transformers' ``ModernBertConfig`` / its ``config.json``.

Architecture: Warner et al. 2024, "Smarter, Better, Faster, Longer: A Modern Bidirectional Encoder" (ModernBERT),
section 2.1: rotary positions (Su et al. 2021) with theta 160,000 in the global layers and 10,000 in the local
ones, a GeGLU feed-forward, pre-normalisation, no biases, and alternating attention: every
``global_attn_every_n_layers``-th layer (from the first) attends globally, the others within a sliding window of
``local_attention`` tokens (``local_attention // 2`` on each side of a query). Field names and defaults:
transformers ``models/modernbert/configuration_modernbert.py`` at v5.24.0 (the same fields at v5.17.0), which reads
both the ``layer_types`` / ``rope_parameters`` form it writes and the older ``global_attn_every_n_layers`` /
``global_rope_theta`` / ``local_rope_theta`` form of the published checkpoints (answerdotai/ModernBERT-base).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from vlbert.common.typed_config import Range, check_fields
from vlbert.common.user_files import expect, read_json

logger = logging.getLogger(__name__)

#: layer_types values: transformers' names of a global and a local (sliding-window) layer.
LAYER_TYPES = ("full_attention", "sliding_attention")
#: The feed-forward / head activations this library implements (:func:`vlbert.layers.activations.activation`).
MODERNBERT_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")

#: config.json keys with no effect on this library's numbers, dropped quietly.
_IGNORED_KEYS = {
    "architectures",
    "model_type",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "_name_or_path",
    "label2id",
    "problem_type",
    "deterministic_flash_attn",  # a flash-attention option of transformers
    "sparse_prediction",  # transformers' MLM on labelled positions: this library always does so with labels
    "sparse_pred_ignore_index",
    "reference_compile",
    "repad_logits_with_grad",
    "use_cache",
    "output_hidden_states",
    "output_attentions",
    "return_dict",
    "tokenizer_class",
    "position_embedding_type",  # a leftover in published ModernBERT configs; ModernBERT's positions are rotary
    "layer_norm_eps",  # likewise; ModernBERT's is norm_eps
}
_HF_ATTENTION_NAMES = {"flash_attention_2": "varlen", "flash_attention_3": "varlen", "flash_attention_4": "varlen"}


def _rope_thetas(values: dict[str, Any]) -> None:
    """Move transformers' ``rope_parameters`` ({"full_attention": {"rope_type", "rope_theta"}, "sliding_attention":
    {...}}) into ``global_rope_theta`` / ``local_rope_theta``, in place. Raises ValueError for a RoPE scaling
    (``rope_type`` other than "default", or ``rope_scaling``), which this library does not implement."""
    if values.get("rope_scaling") is not None:
        raise ValueError(
            f"config.rope_scaling={values['rope_scaling']!r}: scaled RoPE is not implemented; use a checkpoint "
            "trained with ModernBERT's plain rotary positions"
        )
    values.pop("rope_scaling", None)
    rope = values.pop("rope_parameters", None) or {}
    for layer_type, key in (("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta")):
        params = rope.get(layer_type) or {}
        if params.get("rope_type", "default") != "default":
            raise ValueError(
                f"config.rope_parameters[{layer_type!r}] has rope_type={params['rope_type']!r}: only the default "
                "rotary embedding is implemented; use rope_type 'default'"
            )
        if "rope_theta" in params:
            values[key] = float(params["rope_theta"])


@dataclass
class ModernBertConfig:
    """A ModernBERT encoder and its heads (transformers' field names; see the module docstring for the source).

    Fields: vocab_size; hidden_size H; intermediate_size I (the GeGLU's width: its input projection is [2I, H]);
    num_hidden_layers L; num_attention_heads (H / heads must be even: RoPE rotates pairs); hidden_activation (the
    GLU's); max_position_embeddings (the longest sequence: RoPE has no table, this bounds the inputs); norm_eps,
    norm_bias (LayerNorm); attention_bias, mlp_bias (the projections' biases; ModernBERT: none);
    attention_dropout (on the probabilities and after the output projection), embedding_dropout, mlp_dropout;
    local_attention (the sliding window's total width in tokens: a local layer's query sees keys at most
    ``local_attention // 2`` positions away, :attr:`sliding_window`); global_attn_every_n_layers (layer i is
    global when i % n == 0) or layer_types (one of :data:`LAYER_TYPES` per layer; when given it wins, as in
    transformers); global_rope_theta, local_rope_theta (RoPE's base in the two kinds of layer); classifier_pooling
    ("cls": the first token, "mean": the mean over real tokens), classifier_dropout, classifier_bias,
    classifier_activation (the prediction head shared by the MLM and task heads: dense, activation, norm);
    decoder_bias (the MLM output bias); tie_word_embeddings (the MLM decoder is the word embedding matrix: always
    True here); initializer_range, initializer_cutoff_factor (truncated normal initialisation); the special
    token ids; num_labels / id2label (task heads); attn_implementation (a key of
    :data:`vlbert.layers.attention.ATTENTION_FUNCTIONS`, a run-time choice) and gradient_checkpointing.

    Raises:
        ValueError: from :meth:`validate`, naming the field and the fix.
    """

    vocab_size: Annotated[int, Range(ge=1)] = 50368
    hidden_size: Annotated[int, Range(ge=1)] = 768
    intermediate_size: Annotated[int, Range(ge=1)] = 1152
    num_hidden_layers: Annotated[int, Range(ge=1)] = 22
    num_attention_heads: Annotated[int, Range(ge=1)] = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: Annotated[int, Range(ge=1)] = 8192
    initializer_range: Annotated[float, Range(ge=0)] = 0.02
    initializer_cutoff_factor: Annotated[float, Range(gt=0)] = 2.0
    norm_eps: Annotated[float, Range(gt=0)] = 1e-5
    norm_bias: bool = False
    pad_token_id: Annotated[int, Range(ge=0)] | None = 50283
    bos_token_id: Annotated[int, Range(ge=0)] | None = 50281
    eos_token_id: Annotated[int, Range(ge=0)] | None = 50282
    cls_token_id: Annotated[int, Range(ge=0)] | None = 50281
    sep_token_id: Annotated[int, Range(ge=0)] | None = 50282
    attention_bias: bool = False
    attention_dropout: Annotated[float, Range(ge=0, lt=1)] = 0.0
    global_attn_every_n_layers: Annotated[int, Range(ge=1)] = 3
    layer_types: list[str] | None = None
    global_rope_theta: Annotated[float, Range(gt=0)] = 160_000.0
    local_rope_theta: Annotated[float, Range(gt=0)] = 10_000.0
    local_attention: Annotated[int, Range(ge=2)] = 128
    embedding_dropout: Annotated[float, Range(ge=0, lt=1)] = 0.0
    mlp_bias: bool = False
    mlp_dropout: Annotated[float, Range(ge=0, lt=1)] = 0.0
    decoder_bias: bool = True
    classifier_pooling: Literal["cls", "mean"] = "cls"
    classifier_dropout: Annotated[float, Range(ge=0, lt=1)] = 0.0
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    tie_word_embeddings: bool = True
    num_labels: Annotated[int, Range(ge=1)] = 2
    id2label: dict[int, str] | None = None
    attn_implementation: str | None = None
    gradient_checkpointing: bool = False

    model_type = "modernbert"

    def __post_init__(self) -> None:
        self.attn_implementation = _HF_ATTENTION_NAMES.get(self.attn_implementation, self.attn_implementation)
        if self.layer_types is None:
            n = self.global_attn_every_n_layers
            self.layer_types = [LAYER_TYPES[bool(i % n)] for i in range(self.num_hidden_layers)]
        self.validate()

    def validate(self) -> None:
        """Check each field's type and range (:func:`~vlbert.common.typed_config.check_fields`) and the fields'
        consistency; raise ``ValueError`` in one line naming the field and the fix."""
        check_fields(self, "config")
        if self.hidden_size % self.num_attention_heads or self.head_dim % 2:
            raise ValueError(
                f"config.hidden_size ({self.hidden_size}) / num_attention_heads ({self.num_attention_heads}) must be "
                "a whole, even head size (RoPE rotates pairs of a head's dimensions); pick a head count that gives one"
            )
        for name in ("hidden_activation", "classifier_activation"):
            if getattr(self, name) not in MODERNBERT_ACTIVATIONS:
                raise ValueError(
                    f"config.{name}={getattr(self, name)!r} is not supported; use one of {MODERNBERT_ACTIVATIONS}"
                )
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - set(LAYER_TYPES):
            raise ValueError(
                f"config.layer_types must name {LAYER_TYPES} once per layer ({self.num_hidden_layers}), got "
                f"{self.layer_types}; or leave it out and set global_attn_every_n_layers"
            )
        if "sliding_attention" in self.layer_types and self.sliding_window >= self.max_position_embeddings - 1:
            raise ValueError(
                f"config.local_attention={self.local_attention} (a query sees {self.sliding_window} positions each "
                f"side) covers every position of a max_position_embeddings={self.max_position_embeddings} sequence, "
                "so its local layers would attend globally; set local_attention below "
                f"{2 * (self.max_position_embeddings - 1)} (ModernBERT: 128 of 8192), or global_attn_every_n_layers=1"
            )
        if not self.tie_word_embeddings:
            raise ValueError(
                "config.tie_word_embeddings=False: this library's ModernBERT ties the MLM decoder to the word "
                "embeddings, as ModernBERT does; use a checkpoint with tie_word_embeddings true"
            )
        if self.id2label is not None and sorted(self.id2label) != list(range(self.num_labels)):
            raise ValueError(
                f"config.id2label must name labels 0..{self.num_labels - 1} (num_labels), got {sorted(self.id2label)}"
            )

    @property
    def head_dim(self) -> int:
        """Size of one attention head, ``hidden_size // num_attention_heads``."""
        return self.hidden_size // self.num_attention_heads

    @property
    def sliding_window(self) -> int:
        """The positions a local layer's query sees on each side: ``local_attention // 2`` (transformers' property
        of the same name; the ModernBERT repository's flash-attention ``window_size``)."""
        return self.local_attention // 2

    def window(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window (:attr:`sliding_window`), or None for a global layer."""
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    def rope_theta(self, layer: int) -> float:
        """RoPE's base in layer ``layer``: ``local_rope_theta`` in a local layer, ``global_rope_theta`` else."""
        return self.local_rope_theta if self.window(layer) is not None else self.global_rope_theta

    # ------------------------------------------------------------------ (de)serialisation
    @classmethod
    def from_dict(cls, values: dict[str, Any], strict: bool = False) -> "ModernBertConfig":
        """Build a config from a parsed ``config.json`` (either transformers form) or a YAML ``model:`` section.

        Args:
            values: field name -> value.
            strict: if True (run configs written by people), an unknown key is an error; if False (config.json
                files), transformers' bookkeeping keys are dropped and other unknown keys logged and dropped.
        Raises:
            ValueError: ``model_type`` is not "modernbert" (a BERT checkpoint, trained with learned absolute
                positions, named with its fix), a RoPE scaling, an unknown key with ``strict``, or :meth:`validate`.
        """
        values = dict(values)
        model_type = values.get("model_type")
        if model_type is not None and model_type != cls.model_type:
            raise ValueError(
                f"this checkpoint's config.json has model_type={model_type!r}: it was trained with "
                f"{'learned absolute positions' if model_type in ('bert', 'vlbert') else 'another architecture'}, "
                "which ModernBERT's rotary layers cannot read; load it with vlbert.BertModel / BertForPreTraining, or "
                "use a ModernBERT checkpoint (model_type 'modernbert')"
            )
        _rope_thetas(values)
        if "num_labels" not in values and isinstance(values.get("id2label"), dict):
            values["num_labels"] = len(values["id2label"])
        if isinstance(values.get("id2label"), dict):
            names = {int(k): v for k, v in values["id2label"].items()}
            values["id2label"] = None if all(v == f"LABEL_{k}" for k, v in names.items()) else names
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if strict and unknown:
            raise ValueError(f"unknown model config key(s) {unknown}; valid keys are {sorted(known)}")
        surprising = [k for k in unknown if k not in _IGNORED_KEYS]
        if surprising:
            logger.info("ignoring config keys with no meaning for %s: %s", cls.__name__, surprising)
        return cls(**{k: v for k, v in values.items() if k in known})

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "ModernBertConfig":
        """Read a transformers ModernBERT ``config.json``. Raises FileNotFoundError, or ValueError as
        :meth:`from_dict` (and for a file that is not JSON)."""
        values = read_json(path, "model config", "is this a model directory's config.json? write it again")
        return cls.from_dict(expect(values, dict, str(path), "a config.json"))

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` form transformers 5 writes and reads: the fields, ``layer_types`` and
        ``rope_parameters`` (in place of ``global_attn_every_n_layers`` and the two thetas), ``model_type`` and
        ``id2label`` / ``label2id``; without the run-time ``attn_implementation`` and ``gradient_checkpointing``."""
        out = dataclasses.asdict(self)
        for key in ("attn_implementation", "gradient_checkpointing", "global_attn_every_n_layers"):
            del out[key]
        out["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": out.pop("global_rope_theta")},
            "sliding_attention": {"rope_type": "default", "rope_theta": out.pop("local_rope_theta")},
        }
        out["model_type"] = self.model_type
        names = self.id2label or {i: f"LABEL_{i}" for i in range(self.num_labels)}
        out["id2label"] = {str(i): name for i, name in sorted(names.items())}
        out["label2id"] = {name: i for i, name in sorted(names.items())}
        return out

    def to_json_file(self, path: str | os.PathLike, architectures: list[str] | None = None) -> None:
        """Write ``config.json``, which ``transformers.AutoConfig`` (5.17 and later) reads as a ModernBertConfig."""
        values = self.to_dict()
        if self.attn_implementation in ("eager", "sdpa"):
            values["attn_implementation"] = self.attn_implementation
        if architectures:
            values["architectures"] = architectures
        with open(path, "w", encoding="utf-8") as f:
            json.dump(values, f, indent=2, sort_keys=True)
            f.write("\n")


__all__ = ["ModernBertConfig", "LAYER_TYPES", "MODERNBERT_ACTIVATIONS"]
