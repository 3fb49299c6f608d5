"""What stops or skips training: non-finite steps (counted on the device, read at log steps and checkpoints) and
SIGTERM (how clusters preempt jobs: finish the step, write a checkpoint, stop)."""

from __future__ import annotations

import logging
import math

import torch

logger = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
    """Raised when the loss or gradient norm is NaN/inf and ``on_nonfinite`` is ``stop``."""


class TrainingPreempted(RuntimeError):
    """Raised by :meth:`Trainer.train` after a SIGTERM (how clusters preempt jobs): the step in progress was
    finished and a checkpoint written (``checkpoint``); ``--resume`` continues with the same per-step losses."""

    def __init__(self, step: int, checkpoint):
        super().__init__(
            f"stopped by SIGTERM after step {step}; checkpoint written to {checkpoint}. Run the same "
            "command with --resume to continue"
        )
        self.step, self.checkpoint = step, checkpoint


class NonFiniteChecks:
    """Non-finite steps recorded on the device (no host synchronisation) and read at check time.

    ``record`` returns the step's bad flag (a bool tensor) and keeps the count, the first bad step and its loss and
    gradient norm on the device; ``position`` keeps each step's (epoch, batch) on the host, to name it later.
    """

    def __init__(self):
        self.count = None
        self.first = None  # [step, loss, grad_norm] of the first bad step since the last read; step 0 = none
        self.positions: dict[int, tuple[int, int]] = {}

    def position(self, step: int, epoch: int, batch: int) -> None:
        self.positions[step] = (epoch, batch)

    def record(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        loss, grad_norm = loss.detach().float(), grad_norm.detach().float().to(loss.device)
        bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        if self.count is None:
            self.count = torch.zeros((), dtype=torch.int64, device=loss.device)
            self.first = torch.zeros(3, dtype=torch.float64, device=loss.device)
        self.count += bad
        take = bad & (self.first[0] == 0)
        # Python scalars in torch.where are no host-to-device copies (a copy from pageable memory would wait).
        values = torch.stack(
            [
                torch.where(take, float(step), self.first[0]),
                torch.where(take, loss.double(), self.first[1]),
                torch.where(take, grad_norm.double(), self.first[2]),
            ]
        )
        self.first = values
        return bad

    def read(self) -> tuple[int, str] | None:
        """(count, message about the first) if any step since the last read was non-finite; resets."""
        if self.count is None:
            self.positions.clear()
            return None
        count = int(self.count)
        first = self.first.tolist()
        positions, self.positions = self.positions, {}
        self.count = None
        if count == 0:
            return None
        step, loss, grad_norm = int(first[0]), first[1], first[2]
        epoch, batch = positions.get(step, (-1, -1))
        what = "loss" if not math.isfinite(loss) else "gradient norm"
        return count, (
            f"non-finite {what} at step {step} (epoch {epoch}, batch {batch}): loss={loss}, grad_norm={grad_norm}"
        )


class SigtermFlag:
    """Catch SIGTERM while training (main thread only): ``raised`` turns True and training stops at the end of
    the step in progress; the previous handler is put back by :meth:`restore`."""

    def __init__(self):
        import signal
        import threading

        self.raised = False
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        logger.warning("SIGTERM received: finishing this step, writing a checkpoint, then stopping")
        self.raised = True

    def restore(self) -> None:
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


__all__ = ["NonFiniteLossError", "TrainingPreempted", "NonFiniteChecks", "SigtermFlag"]
