"""What ``init_from`` decides when a run starts from a checkpoint: its architecture (the ``model`` section's
conflicting entries are dropped, or refused where given on the command line) and the size of the region features
its region pathway reads; :func:`load_model` builds a task's model from it, or fresh from the config."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlbert import checkpoint as ckpt
from vlbert.config import BertConfig
from vlbert.recipes.config_reading import same_value
from vlbert.run_files import read_run_file

if TYPE_CHECKING:
    from vlbert.recipes.runner import RunContext

logger = logging.getLogger(__name__)


def checkpoint_architecture_decides(ctx: RunContext) -> dict[str, Any]:
    """The ``model`` section without the architecture entries that conflict with ``ctx.init_from``'s config.json.

    Continuing from a checkpoint is the common case, so the checkpoint's architecture
    (:attr:`~vlbert.config.BertConfig.ARCHITECTURE_FIELDS`) wins over a config file's ``model`` section: the
    conflicting entries are dropped with one warning line. Other entries (dropout, num_labels) still apply.

    Raises:
        ValueError: a conflicting entry was set on the command line (``--set model.hidden_size=...``): the
            message names the keys, both values and the fix.
    """
    section = ctx.model_section
    config_file = ckpt.resolve_checkpoint_dir(ctx.init_from) / ckpt.CONFIG_NAME
    if not section or not config_file.is_file():
        return section
    saved = read_run_file(config_file)
    conflicts = {
        k: (section[k], saved[k])
        for k in BertConfig.ARCHITECTURE_FIELDS
        if k in section and k in saved and not same_value(section[k], saved[k])
    }
    given = [k for k in conflicts if f"model.{k}" in ctx.command_line_keys]
    if given:
        raise ValueError(
            f"--set {', '.join(f'model.{k}={conflicts[k][0]}' for k in given)} conflicts with the architecture of "
            f"init_from {ctx.init_from} ({', '.join(f'{k}={conflicts[k][1]}' for k in given)}); a checkpoint "
            "decides its own architecture: drop those --set flags, or train a fresh model without --init-from"
        )
    if conflicts:
        logger.warning(
            "init_from %s decides the architecture: ignoring the config's model entries %s",
            ctx.init_from,
            ", ".join(f"{k}={v} (checkpoint: {c})" for k, (v, c) in conflicts.items()),
        )
    return {k: v for k, v in section.items() if k not in conflicts}


def load_model(cls, ctx: RunContext, **defaults):
    """``cls`` from ``ctx.init_from`` with ``defaults`` and the ``model`` section as config overrides (the
    checkpoint's architecture deciding: :func:`checkpoint_architecture_decides`), or a fresh model from them
    (vocab_size and pad_token_id from the tokenizer) when there is no ``init_from``.

    Raises:
        ValueError: ``defaults`` has a ``region_feature_dim`` other than that of a vision-language ``init_from``
            (the regions come from another detector than the one its region pathway was trained on).
    """
    if ctx.init_from:
        saved = _saved_config(ctx.init_from)
        dim = defaults.get("region_feature_dim")
        if dim is not None and saved.get("model_type") == "vlbert" and saved.get("region_feature_dim", dim) != dim:
            raise ValueError(
                f"this run's regions have {dim}-d features, but init_from {ctx.init_from} reads "
                f"{saved['region_feature_dim']}-d region features: extract the regions with the detector it was trained "
                "on (its processor.json names it), or start from a text BERT"
            )
        return cls.from_pretrained(ctx.init_from, **{**defaults, **checkpoint_architecture_decides(ctx)})
    values = {**defaults, **ctx.model_section}
    values.setdefault("vocab_size", len(ctx.tokenizer))
    values.setdefault("pad_token_id", ctx.tokenizer.pad_token_id)
    return cls(cls.config_class.from_dict(values, strict=True))


def _saved_config(init_from: str) -> dict[str, Any]:
    path = Path(init_from) / ckpt.CONFIG_NAME
    return read_run_file(path) if path.is_file() else {}


__all__ = ["load_model", "checkpoint_architecture_decides"]
