"""Idle parameters under DDP, applied in one place.

A model declares, per forward, the parameters its loss did not reach (``ObjectiveOutput.unused_parameters``: the heads
of the objectives a step does not train, a region pathway's masked-region modules; each model says which in its
``idle_modules``). DDP needs every parameter in every backward: :class:`IdleParameters` enters them into the loss with
weight zero when several processes train (so DDP needs no ``find_unused_parameters`` search), and drops the
gradients of those idle in every micro-batch of the step, so the optimizer skips them exactly as in one process
(where they get no gradient at all).
"""

from __future__ import annotations

import torch


class IdleParameters:
    """The idle parameters of one optimizer step: :meth:`add_to_loss` for each micro-batch's backward,
    :meth:`record` of each micro-batch's declaration, then :meth:`drop_gradients` before the optimizer step."""

    def __init__(self):
        self._idle: dict[int, torch.nn.Parameter] | None = None  # idle in every micro-batch so far

    @staticmethod
    def add_to_loss(loss: torch.Tensor, out, num_processes: int) -> torch.Tensor:
        """``loss`` (the backward loss of ``out``) plus the parameters ``out`` declares idle with weight zero under DDP
        (``num_processes`` > 1); ``loss`` itself otherwise (nothing added to the graph)."""
        idle = getattr(out, "unused_parameters", ())
        if num_processes == 1 or not idle:
            return loss
        return loss + sum(p.sum() for p in idle) * 0.0

    def record(self, out) -> None:
        """Keep the parameters ``out`` declares idle that every earlier micro-batch of the step declared too."""
        ids = {id(p): p for p in getattr(out, "unused_parameters", ())}
        self._idle = ids if self._idle is None else {k: p for k, p in self._idle.items() if k in ids}

    def drop_gradients(self, master=None) -> None:
        """Set the gradient of every parameter idle in the whole step to None (its float32 master's with bf16
        parameters, ``master``: :class:`~vlbert.training.master_weights.MasterWeights`), so AdamW skips it: no weight
        decay, no momentum step."""
        for p in (self._idle or {}).values():
            (master.master_of(p) if master else p).grad = None


__all__ = ["IdleParameters"]
