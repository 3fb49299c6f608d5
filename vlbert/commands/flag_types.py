"""The tools' flag types (argparse ``type=``): counts and steps of at least 1 (or 0 where 0 means "the default"),
and devices that exist on this machine. A flag that fails is argparse's one ``error: argument --x: ...`` line with
status 2, raised while the flags are read, before anything is built, loaded or timed."""

from __future__ import annotations

import argparse
from typing import Callable


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: the flag's text as an int >= ``low``.

    Raises (from the returned function):
        argparse.ArgumentTypeError: not an integer, or below ``low`` (``must be an integer >= 1, got 0``).
    """

    def read(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value}")
        return value

    read.__name__ = f"integer >= {low}"
    return read


#: A count of images, steps, repeats, ...: an int >= 1.
count = at_least(1)
#: A count where 0 means "the default" (threads, workers, warm-up steps): an int >= 0.
count_or_zero = at_least(0)


def missing_device(name: str) -> str | None:
    """Why the torch device ``name`` ("cpu", "cuda", "cuda:1", "mps") cannot be used on this machine, or None where
    it can: not a device name, no CUDA (or MPS), or a CUDA index beyond the GPUs there are."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        return f"{name!r} is not a device name; give cpu, cuda, cuda:N or mps"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return (
                f"{name} is not available: this machine has no CUDA GPU (torch.cuda.is_available() is False); use cpu"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            n = torch.cuda.device_count()
            return (
                f"{name} does not exist: this machine has {n} CUDA GPU{'s' if n != 1 else ''} (cuda:0 to cuda:{n - 1})"
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        return f"{name} is not available on this machine; use cpu"
    return None


def device(name: str) -> str:
    """An argparse type: ``name`` where it is a device this machine has (:func:`missing_device`).

    Raises:
        argparse.ArgumentTypeError: the device cannot be used here (why, and what to give instead).
    """
    problem = missing_device(name)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return name


__all__ = ["at_least", "count", "count_or_zero", "missing_device", "device"]
