"""The shape of a pretraining objective unit.

A unit owns the three things an objective is made of: how its batch is prepared (the collator side: which
inputs it masks and which labels it adds), its head (built on the model under a fixed attribute name, so
checkpoints keep their key names), and its loss with the number of predictions the loss averages over. Models
run every unit whose labels are in the batch; the collator runs the units the batch's objective names. Adding an
objective is one unit module plus its entry in :data:`vlbert.objectives.OBJECTIVES` and one config line.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn


@dataclass
class Encoded:
    """What a unit's loss reads from the encoder pass.

    Attributes:
        model: the pretraining model (heads are its attributes; the word embeddings for tied MLM decoders).
        text: float [B, T, H], the text positions of the last layer.
        regions: float [B, R, H] (VL models) or None.
        pooled: float [B, H], the pooled [CLS].
    """

    model: nn.Module
    text: torch.Tensor
    regions: torch.Tensor | None
    pooled: torch.Tensor | None


@dataclass
class PrepareContext:
    """What the collator side of a unit needs besides the items: the text masker (``mask_one``/``pad``),
    ``region_mask_probability``, and each item's own random generator (``generator(item, name)``)."""

    text: Any
    region_mask_probability: float = 0.15

    @staticmethod
    def generator(item: dict, name: str) -> torch.Generator:
        """A generator seeded by the item's ``sample_seed`` and the unit's name: a sample's masking depends on
        nothing else (not on its batch or rank), so N processes at batch b = 1 process at N x b."""
        # zlib.crc32, not hash(): str hashes differ between processes (PYTHONHASHSEED), seeds must not.
        seed = (int(item.get("sample_seed", 0)) * 1_000_003 + zlib.crc32(name.encode())) & 0x7FFFFFFFFFFF
        return torch.Generator().manual_seed(seed)


class ObjectiveResult(NamedTuple):
    """A unit's loss (0-d float), its metric (0-d, detached), the number of predictions both average over, and
    the logits it computed (for the model's output)."""

    loss: torch.Tensor
    metric: torch.Tensor
    count: int
    logits: torch.Tensor | None = None


class Objective:
    """Base class of a pretraining objective unit (see module docstring).

    Class attributes:
        name: the objective's name in configs, logs and ``ObjectiveOutput.losses`` (e.g. ``"mlm"``).
        metric: the name of its metric in ``ObjectiveOutput.metrics`` (e.g. ``"mlm_accuracy"``).
        head: the model attribute holding its head (``"masked_lm"``); units may share a head.
        inputs: the batch keys holding its labels; a model computes the unit when all are given.
        reads: other submodules (dotted names) only this kind of objective uses, e.g. the pooler for ITM; with
            the head they make the unit's footprint, idle when the unit does not run.
    """

    name: str = ""
    metric: str = ""
    head: str = ""
    inputs: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()

    def footprint(self) -> tuple[str, ...]:
        """The submodules (dotted names) whose parameters only this unit's loss reaches."""
        return (self.head, *self.reads)

    def build_head(self, config) -> nn.Module | None:
        """The head module for ``config`` (None: the unit cannot run with this config, e.g. MRC without classes)."""
        raise NotImplementedError

    def prepare(self, batch: dict, items: list[dict], ctx: PrepareContext) -> None:
        """Collator side: mask ``batch``'s inputs in place and add this unit's labels (keys :attr:`inputs`)."""
        raise NotImplementedError

    def loss(self, encoded: Encoded, labels: dict[str, torch.Tensor]) -> ObjectiveResult:
        """The loss from the encoder output and this unit's labels (keys :attr:`inputs`). With no prediction
        the loss is a zero that still depends on the head, so backward reaches every parameter."""
        raise NotImplementedError


__all__ = ["Objective", "ObjectiveResult", "Encoded", "PrepareContext"]
