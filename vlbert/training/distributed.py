"""Losses across processes: each rank's share of the global batch's predictions, so that DDP's gradient average is
one process's gradient at the global batch."""

from __future__ import annotations

import torch


def global_batch_loss(out, names, acc) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss to backpropagate, the loss over the whole global batch) for one micro-batch.

    One process: both are ``out.loss``. Several: each objective's mean loss is re-weighted by this rank's share of
    the objective's predictions across ranks (e.g. masked tokens), so that DDP's gradient average equals the
    gradient of the mean over every prediction of the global batch, exactly as one process would compute it
    (transformers' ``num_items_in_batch`` fix, applied across ranks). ``names``: the model's ``objectives`` (loss
    names); without them the plain per-rank mean is used. ``acc``: the accelerate ``Accelerator``.
    """
    if acc.num_processes == 1:
        return out.loss, out.loss
    if not names:
        return out.loss, out.loss
    device = out.loss.device
    counts = device_counts([out.counts.get(n, 0) for n in names], device)
    sums = torch.stack(
        [
            out.losses[n].detach().double() * out.counts[n]
            if n in out.losses
            else torch.zeros((), device=device, dtype=torch.float64)
            for n in names
        ]
    )
    totals = acc.reduce(torch.stack([counts, sums]), reduction="sum")
    # Objectives absent from the whole global batch weigh 0 (on the device: no host synchronisation).
    present = totals[0] > 0
    weights = torch.where(present, counts * acc.num_processes / totals[0].clamp(min=1), 0.0).float()
    backward = sum(out.losses[n] * weights[i] for i, n in enumerate(names) if n in out.losses)
    global_loss = torch.where(present, totals[1] / totals[0].clamp(min=1), 0.0).sum().float()
    return backward, global_loss


def device_counts(counts: list, device: torch.device) -> torch.Tensor:
    """float64 [len(counts)] on ``device``: host integers travel in one copy that does not make the host wait
    (page-locked memory, ``non_blocking=True``; a copy with ``non_blocking=False`` would wait for every kernel
    queued before it, torch's ``copy_`` then synchronising the stream); a count that is already a 0-d tensor (the
    qa unit's question rows, counted on the device) is added there, never read back."""
    host = torch.tensor([0.0 if torch.is_tensor(c) else float(c) for c in counts], dtype=torch.float64)
    if device.type == "cuda":
        host = host.pin_memory()
    values = host.to(device, non_blocking=True)
    if not any(torch.is_tensor(c) for c in counts):
        return values
    return torch.stack(
        [
            c.to(device, torch.float64, non_blocking=True) if torch.is_tensor(c) else values[i]
            for i, c in enumerate(counts)
        ]
    )


__all__ = ["global_batch_loss", "device_counts"]
