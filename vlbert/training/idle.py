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
        self._idle: set[str] | None = None  # the names of those idle in every micro-batch so far

    @staticmethod
    def add_to_loss(loss: torch.Tensor, out, num_processes: int) -> torch.Tensor:
        """``loss`` (the backward loss of ``out``) plus the parameters ``out`` declares idle with weight zero under DDP
        (``num_processes`` > 1); ``loss`` itself otherwise (nothing added to the graph)."""
        idle = getattr(out, "unused_parameters", ())
        if num_processes == 1 or not idle:
            return loss
        return loss + sum(p.sum() for p in idle) * 0.0

    def record(self, out, model: torch.nn.Module) -> None:
        """Keep the parameters ``out`` declares idle that every earlier micro-batch of the step declared too, by their
        names in ``model`` (read after the forward, before the backward: a model sharded by FSDP2 holds the
        gathered weights ``out`` declares only until its backward, its shards afterwards)."""
        idle = {id(p) for p in getattr(out, "unused_parameters", ())}
        names = {n for n, p in model.named_parameters() if id(p) in idle} if idle else set()
        self._idle = names if self._idle is None else self._idle & names

    def drop_gradients(self, model: torch.nn.Module) -> None:
        """Set the gradient of every parameter of ``model`` idle in the whole step to None (a sharded model's float32
        shards'), so AdamW skips it: no weight decay, no momentum step."""
        if self._idle:
            for name, p in model.named_parameters():
                if name in self._idle:
                    p.grad = None


__all__ = ["IdleParameters"]
