"""DataLoaders for the trainer: deterministic, resumable training batches per epoch and rank, and fixed
evaluation batches; where a task mixes objectives, each batch's items are tagged with the step's objective, and
where it asks, with fields of the step (text pretraining: the masking rate of a schedule)."""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils.data import DataLoader, Dataset

from vlbert.data.pretraining import LengthGroupedBatchSampler


class _Tagged(Dataset):
    """``dataset[i]`` with the entries of ``fields`` added, for keys ``(i, fields)`` (e.g. ``{"objective": name}``)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        index, fields = key
        return {**self.dataset[index], **fields}


def train_loader(
    dataset,
    collate_fn,
    batch_size: int,
    seed: int,
    epoch: int,
    start: int = 0,
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool = True,
    group_size: int = 50,
    num_workers: int = 0,
    objectives=None,
    batches_per_step: int = 1,
    step_fields: Callable[[int], dict] | None = None,
) -> DataLoader:
    """Length-grouped batches of ``epoch`` for one data-parallel rank, from batch ``start`` on.

    Args:
        dataset: needs ``lengths()`` (and may have ``set_epoch``, called first).
        objectives: an :class:`~vlbert.objectives.ObjectiveMix`, or None. With one, every item of batch k is
            tagged with the objective drawn for step k // ``batches_per_step`` (gradient accumulation: one
            objective per optimizer step), the same on every rank.
        step_fields: ``step -> dict`` or None. With one, every item of a batch carries the entries of
            ``step_fields(s)``, ``s`` the run's optimizer step that batch serves: (``epoch`` x this epoch's number of
            batches + its index in the epoch) // ``batches_per_step``, as the trainer consumes batches epoch after
            epoch (every epoch of a dataset has the same number of batches). A function of the position alone, so
            a resumed run's batches carry what an uninterrupted run's do.
    The loader gets its own random generator: creating it must not draw from the global RNG that dropout uses,
    or a run resumed mid-epoch would see different dropout masks than an uninterrupted one.
    """
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(epoch)
    sampler = LengthGroupedBatchSampler(
        dataset.lengths(),
        batch_size,
        seed=seed,
        epoch=epoch,
        group_size=group_size,
        drop_last=drop_last,
        rank=rank,
        world_size=world_size,
    )
    every = sampler.batches()
    batches = every[start:]
    if objectives is not None or step_fields is not None:
        first = epoch * len(every) + start  # the run's index of this loader's first batch
        tagged = []
        for k, batch in enumerate(batches):
            fields = _fields(objectives, step_fields, seed, epoch, start + k, first + k, batches_per_step)
            tagged.append([(i, fields) for i in batch])
        batches = tagged
        dataset = _Tagged(dataset)
    return DataLoader(
        dataset,
        batch_sampler=batches,
        collate_fn=collate_fn,
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available(),
        generator=torch.Generator().manual_seed(seed + epoch),
    )


def _fields(objectives, step_fields, seed: int, epoch: int, batch: int, run_batch: int, per_step: int) -> dict:
    """The fields of the items of batch ``batch`` of ``epoch`` (``run_batch`` in the run): the objective
    ``objectives`` draws for the epoch's step ``batch // per_step`` and ``step_fields`` of the run's optimizer step
    ``run_batch // per_step``."""
    fields = dict(step_fields(run_batch // per_step)) if step_fields is not None else {}
    if objectives is not None:
        fields["objective"] = objectives.draw(seed, epoch, batch // per_step)
    return fields


def eval_loader(
    dataset,
    collate_fn,
    batch_size: int,
    max_batches: int = 0,
    objective: str | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> DataLoader:
    """Every item once, in length-sorted batches (fixed: the same at every evaluation); with ``objective``, every
    item tagged with it. With ``world_size`` > 1 only this ``rank``'s share: batches rank, rank + world_size, ...
    (each process evaluates 1/N of the items; the results are then gathered or summed across ranks)."""
    batches = LengthGroupedBatchSampler(dataset.lengths(), batch_size, shuffle=False).batches()
    if max_batches:
        batches = batches[:max_batches]
    batches = batches[rank::world_size]
    if objective is not None:
        batches = [[(i, {"objective": objective}) for i in batch] for batch in batches]
        dataset = _Tagged(dataset)
    return DataLoader(dataset, batch_sampler=batches, collate_fn=collate_fn, generator=torch.Generator().manual_seed(0))


__all__ = ["train_loader", "eval_loader"]
