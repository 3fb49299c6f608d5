"""Which text encoder a vision-language model's config chooses, and a ModernBERT tower's fields inside it.

A :class:`~vlbert.config.VLBertConfig` holds the sizes the whole model shares (``vocab_size``, ``hidden_size``,
``num_hidden_layers``, ``num_attention_heads``, ``intermediate_size``, ``max_position_embeddings``,
``pad_token_id``, ``initializer_range``: :data:`SHARED_FIELDS`) whatever its text tower; with
``text_tower: modernbert`` its ``modernbert`` mapping holds the rest of a
:class:`~vlbert.modernbert_config.ModernBertConfig` (``local_attention``, ``global_attn_every_n_layers`` or
``layer_types``, the two RoPE thetas, ``norm_eps``, the biases and dropouts, ``hidden_activation``), and
:func:`modernbert_tower_config` joins the two into the tower's config. A transformers ModernBERT ``config.json``
(``model_type`` "modernbert", what ``--init-from`` a ModernBERT directory reads) becomes such a config through
:func:`vl_values_from_modernbert`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vlbert.modernbert_config import ModernBertConfig

#: The text towers a vision-language config may choose (``text_tower``); the models are
#: :data:`vlbert.models.text_towers.TEXT_TOWERS`.
TEXT_TOWER_NAMES = ("bert", "modernbert")
#: Fields of the vision-language config that its ModernBERT tower reads as they are.
SHARED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "pad_token_id",
    "initializer_range",
)
#: Run-time choices the tower takes from the vision-language config (never written in ``modernbert``).
_RUN_TIME_FIELDS = ("attn_implementation", "gradient_checkpointing")
#: ModernBERT fields of its own task heads, which a vision-language model (with heads of its own) does not read.
_HEAD_FIELDS = (
    "num_labels",
    "id2label",
    "classifier_pooling",
    "classifier_dropout",
    "classifier_bias",
    "decoder_bias",
    "tie_word_embeddings",
)


def modernbert_tower_config(config) -> ModernBertConfig:
    """The ModernBERT config of the text tower of ``config`` (a :class:`~vlbert.config.VLBertConfig` with
    ``text_tower`` "modernbert"): its :data:`SHARED_FIELDS`, ``attn_implementation`` and ``gradient_checkpointing``,
    and its ``modernbert`` mapping.

    Raises:
        ValueError: the mapping names a shared field (set it on the model config instead), a run-time field, a key
            that is no ModernBERT field, or values :meth:`ModernBertConfig.validate` refuses; one line naming the fix.
    """
    own = dict(config.modernbert or {})
    doubled = sorted(set(own) & set(SHARED_FIELDS + _RUN_TIME_FIELDS))
    if doubled:
        raise ValueError(
            f"config.modernbert sets {doubled}, which the vision-language config holds for the whole model; set "
            f"{', '.join('model.' + k for k in doubled)} instead"
        )
    values = {k: getattr(config, k) for k in SHARED_FIELDS + _RUN_TIME_FIELDS}
    try:
        return ModernBertConfig.from_dict({**own, **values}, strict=True)
    except ValueError as e:
        raise ValueError(f"config.modernbert: {e}") from None


def vl_values_from_modernbert(values: dict[str, Any]) -> dict[str, Any]:
    """A transformers ModernBERT ``config.json`` (either form: :meth:`ModernBertConfig.from_dict`) as the values of a
    vision-language config with that text tower: the shared sizes, ``text_tower`` "modernbert", the tower's own
    fields under ``modernbert`` (``layer_types`` spelled out, both thetas), and, for the vision-language heads (the
    masked-LM head, the region pathway's norms), ModernBERT's prediction-head activation as ``hidden_act`` and its
    ``norm_eps`` as ``layer_norm_eps``. ModernBERT's own task-head fields are dropped.

    Raises:
        ValueError: as :meth:`ModernBertConfig.from_dict`."""
    text = ModernBertConfig.from_dict(values)
    fields = dataclasses.asdict(text)
    skipped = set(SHARED_FIELDS + _RUN_TIME_FIELDS + _HEAD_FIELDS) | {"global_attn_every_n_layers"}
    return {
        **{k: fields[k] for k in SHARED_FIELDS},
        "text_tower": "modernbert",
        "modernbert": {k: v for k, v in fields.items() if k not in skipped},
        "hidden_act": text.classifier_activation,
        "layer_norm_eps": text.norm_eps,
    }


__all__ = ["TEXT_TOWER_NAMES", "SHARED_FIELDS", "modernbert_tower_config", "vl_values_from_modernbert"]
