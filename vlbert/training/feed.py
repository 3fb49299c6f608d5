"""Batches onto the device ahead of the step that needs them.

On CUDA each batch is copied from the loader's pinned memory on a side stream while the step before it computes,
so the copy (mostly region features: docs/distributed.md has its size and time) leaves the compute stream; the
compute stream waits for the copy's event only when the batch is used, and every copied tensor is recorded on the
compute stream (``Tensor.record_stream``) so the caching allocator does not hand its memory to the side stream
before the step that reads it is done. This is the prefetcher of NVIDIA's reference trainers
(NVIDIA/DeepLearningExamples ``PyTorch/Classification/ConvNets/image_classification/dataloaders.py``,
``PrefetchedWrapper``) and torchtitan's; the bookkeeping of which batch was consumed stays the trainer's.
Elsewhere (CPU) the copy is the tensors themselves.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from vlbert.layers.unpadded import StreamLayouts, UnpaddedLayout
from vlbert.training.mfu import count_positions


def moves_to_device(value) -> bool:
    """Whether a batch value travels to the device: a tensor, or the collator's unpadded layout (a container of
    tensors with ``to`` / ``record_stream``: :class:`~vlbert.layers.unpadded.UnpaddedLayout`, ``StreamLayouts``)."""
    return torch.is_tensor(value) or isinstance(value, (UnpaddedLayout, StreamLayouts))


class DeviceFeed:
    """Copies batches (dicts of host tensors and other values) to ``device``: :meth:`send` issues the copy,
    :meth:`receive` hands the batch to the compute stream. Send batch k + 1 before receiving batch k, and the
    copy of k + 1 overlaps step k.

    Args:
        device: the training device; a side stream is made on CUDA.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def send(self, batch: dict) -> tuple[dict, Any]:
        """(the batch's tensors on the device, the event that marks their copy done, None off CUDA); the copies
        do not make the host wait (``non_blocking``: from the loader's pinned memory, asynchronous)."""
        if self.stream is None:
            return {k: v.to(self.device) if moves_to_device(v) else v for k, v in batch.items()}, None
        with torch.cuda.stream(self.stream):
            moved = {k: v.to(self.device, non_blocking=True) if moves_to_device(v) else v for k, v in batch.items()}
            event = torch.cuda.Event()
            event.record(self.stream)
        return moved, event

    def receive(self, sent: tuple[dict, Any]) -> dict:
        """The batch of :meth:`send`, ready for the compute stream: it waits (on the device, not the host) for the
        copy's event, and the tensors are recorded on it."""
        moved, event = sent
        if event is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(event)
            for value in moved.values():
                if moves_to_device(value):
                    value.record_stream(compute)
        return moved


def device_batches(trainer) -> Iterator[tuple[dict, int, int, int]]:
    """(batch on the device, real text tokens, sequences, real regions) for every training batch of ``trainer``
    (a :class:`~vlbert.training.trainer.Trainer`: its ``train_batches`` from its ``epoch`` / ``batch_in_epoch``),
    epoch after epoch, counted on the host copy (:func:`~vlbert.training.mfu.count_positions`). Batch k + 1 is
    sent (:class:`DeviceFeed`) before batch k is handed over, so on CUDA its copy overlaps step k; the trainer's
    ``epoch`` / ``batch_in_epoch`` say where the batches handed over end (resume's place), set at each hand-over,
    not where the loader is.

    Raises:
        ValueError: an epoch from its start yields no batch.
    """
    acc, feed, pending = trainer.accelerator, DeviceFeed(trainer.device), None
    epoch, start = trainer.epoch, trainer.batch_in_epoch
    while True:
        produced = False
        for i, batch in enumerate(trainer.train_batches(epoch, start, acc.process_index, acc.num_processes)):
            produced = True
            sent = (feed.send(trainer._inputs(batch)), count_positions(batch), epoch, start + i + 1)
            if pending is not None:
                moved, (tokens, regions, sequences), trainer.epoch, trainer.batch_in_epoch = pending
                yield feed.receive(moved), tokens, sequences, regions
            pending = sent
        if not produced and start == 0:
            raise ValueError("the training data yields no batch; use a larger corpus or a smaller batch_size")
        epoch, start = epoch + 1, 0


__all__ = ["DeviceFeed", "device_batches"]
