"""An evaluation's work split across the processes of a run: each rank takes a contiguous share of the rows, and
the shares are gathered back in order. Every rank computes its share's size from ``n`` alone, so no sizes are
exchanged (no host read): the gathered tensor is the one a single process would have computed."""

from __future__ import annotations

import torch

from vlbert.utils import all_gather_equal, process_position


def share(n: int, rank: int | None = None, world: int | None = None) -> range:
    """The rows of ``n`` that ``rank`` of ``world`` processes takes: contiguous, in rank order, their sizes
    differing by at most one (``n * rank // world`` to ``n * (rank + 1) // world``); by default this process's.

    Raises:
        ValueError: ``n`` < 0, or ``rank`` outside ``[0, world)``."""
    here, size = process_position()
    rank, world = (here if rank is None else rank), (size if world is None else world)
    if n < 0 or not 0 <= rank < world:
        raise ValueError(f"cannot share {n} rows as rank {rank} of {world} processes: need n >= 0, 0 <= rank < world")
    return range(n * rank // world, n * (rank + 1) // world)


def gather_shares(part: torch.Tensor, n: int) -> torch.Tensor:
    """Every process's ``part`` (its :func:`share` of ``n`` rows, any trailing shape, on its device; the same
    trailing shape and dtype on every rank) concatenated in rank order: the ``n`` rows a single process would hold.
    Without a process group, ``part`` itself. Each rank pads its part to the largest share and
    :func:`~vlbert.utils.all_gather_equal` collects them (gloo on CPU, NCCL on CUDA tensors).

    Raises:
        ValueError: ``part`` is not this process's share of ``n`` (another number of rows)."""
    rank, world = process_position()
    mine = share(n, rank, world)
    if part.shape[0] != len(mine):
        raise ValueError(f"rank {rank} holds {part.shape[0]} rows of {n}, its share is {len(mine)}: pass share(n)'s")
    if world == 1:
        return part
    sizes = [len(share(n, r, world)) for r in range(world)]
    padded = part.new_zeros((max(sizes), *part.shape[1:]))
    padded[: part.shape[0]] = part
    parts = all_gather_equal(padded).split(max(sizes))
    return torch.cat([p[:k] for p, k in zip(parts, sizes, strict=True)])


__all__ = ["share", "gather_shares"]
