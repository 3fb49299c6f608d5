"""DataLoaders for the trainer: deterministic, resumable training batches per epoch and rank, and fixed
evaluation batches."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from vlbert.data.pretraining import LengthGroupedBatchSampler


def train_loader(dataset, collate_fn, batch_size: int, seed: int, epoch: int, start: int = 0, rank: int = 0,
                 world_size: int = 1, drop_last: bool = True, group_size: int = 50,
                 num_workers: int = 0) -> DataLoader:
    """Length-grouped batches of ``epoch`` for one data-parallel rank, from batch ``start`` on.

    ``dataset`` needs ``lengths()`` (and may have ``set_epoch``, called first). The loader gets its own random
    generator: creating it must not draw from the global RNG that dropout uses, or a run resumed mid-epoch would
    see different dropout masks than an uninterrupted one.
    """
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(epoch)
    sampler = LengthGroupedBatchSampler(dataset.lengths(), batch_size, seed=seed, epoch=epoch, group_size=group_size,
                                        drop_last=drop_last, rank=rank, world_size=world_size)
    return DataLoader(dataset, batch_sampler=sampler.batches()[start:], collate_fn=collate_fn,
                      num_workers=num_workers, pin_memory=torch.cuda.is_available(),
                      generator=torch.Generator().manual_seed(seed + epoch))


def eval_loader(dataset, collate_fn, batch_size: int, max_batches: int = 0) -> DataLoader:
    """Every item once, in length-sorted batches (fixed: the same at every evaluation)."""
    batches = LengthGroupedBatchSampler(dataset.lengths(), batch_size, shuffle=False).batches()
    if max_batches:
        batches = batches[:max_batches]
    return DataLoader(dataset, batch_sampler=batches, collate_fn=collate_fn,
                      generator=torch.Generator().manual_seed(0))


__all__ = ["train_loader", "eval_loader"]
