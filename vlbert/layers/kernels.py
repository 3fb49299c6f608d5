"""Custom autograd kernels the models use for speed, each equal in value and gradient to what it replaces
(tests/layers/test_fast_paths.py): CPU dropout with integer masks and a fused cross-entropy that also yields accuracy."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _CpuDropout(torch.autograd.Function):
    """Inverted dropout with the keep mask drawn as 31-bit integers (one ``random_`` pass and a compare).

    On CPU ``torch.bernoulli_`` is slower than drawing integers (docs/performance.md), and dropout runs thirteen
    times per step in a 4-layer BERT (embeddings, then attention probabilities, attention output and
    feed-forward output per layer). The keep probability is (2^31 - round(p 2^31)) / 2^31, within 5e-10 of
    1 - p; the random stream is the default CPU generator's, so ``torch.manual_seed`` and checkpointed RNG
    state reproduce the masks.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float):
        keep = torch.empty(x.shape, dtype=torch.int32, device=x.device).random_() >= round(p * 2**31)
        mask = keep.to(x.dtype)
        scale = 1.0 / (1.0 - p)
        if x.dtype in (torch.float32, torch.float64):
            mask.mul_(scale)  # the scaled mask: one multiply forward and backward
            scale = 1.0
        ctx.save_for_backward(mask)
        ctx.scale = scale
        y = x * mask
        return y.mul_(scale) if scale != 1.0 else y  # low precision: scale by the exact Python float

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        out = grad * mask
        return (out.mul_(ctx.scale) if ctx.scale != 1.0 else out), None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout (Srivastava et al. 2014): zero each element with probability ``p`` and scale the rest by
    1 / (1 - p) while ``training``; identity otherwise. Same distribution as ``F.dropout``; on CPU the mask is
    drawn faster (see :class:`_CpuDropout`), elsewhere this is ``F.dropout``.

    Args: x float tensor of any shape; p in [0, 1]. Returns a tensor like ``x``.
    Raises: ValueError if p is outside [0, 1].
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p == 1.0 or torch.compiler.is_compiling():
        return F.dropout(x, p, True)  # compiled: inductor fuses F.dropout with its neighbours
    return _CpuDropout.apply(x, p)


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same ``p``, no parameters, same state dict) that calls :func:`dropout`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


class _CrossEntropyWithArgmax(torch.autograd.Function):
    """Mean cross-entropy of [N, C] logits that also returns each row's argmax, in fewer memory passes.

    ``F.cross_entropy`` + ``argmax`` read and write an [N, C] tensor about nine times (log-softmax out, NLL
    gradient zero-filled then scattered, log-softmax backward, a separate argmax); at C = 30,522 those passes cost
    more than the vocabulary matmul's non-matmul neighbours combined on a CPU. Here the forward takes the row max
    and its index in one pass (the index is the prediction, so accuracy is free), keeps ``exp(x - max)`` and its
    row sums, and the backward is one multiply: d loss / d x = (exp(x - max) - onehot(target) sum) / (sum N).
    bf16/fp16 logits are never copied to float32: the max is exact in their dtype, ``x - max`` reads them and
    computes in float32, and the gradient is written in their dtype by the multiply. Not twice differentiable.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor):
        row_max, argmax = logits.max(-1)
        row_max = row_max if row_max.dtype in (torch.float32, torch.float64) else row_max.float()
        exp = torch.sub(logits, row_max[:, None]).exp_()  # float32 (or float64): mixed-dtype arithmetic upcasts
        sum_exp = exp.sum(-1)
        loss = (sum_exp.log() + row_max - logits.gather(1, targets[:, None]).squeeze(1).to(row_max.dtype)).mean()
        ctx.save_for_backward(exp, sum_exp, targets)
        ctx.logits_dtype = logits.dtype
        ctx.mark_non_differentiable(argmax)
        return loss, argmax

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss: torch.Tensor, _grad_argmax):
        exp, sum_exp, targets = ctx.saved_tensors
        n = targets.numel()
        exp[torch.arange(n, device=exp.device), targets] -= sum_exp  # in place: the saved buffer is read once
        grad = torch.empty(exp.shape, dtype=ctx.logits_dtype, device=exp.device)
        return torch.mul(exp, ((grad_loss / n) / sum_exp)[:, None], out=grad), None


def cross_entropy_with_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy and top-1 accuracy of logits against class indices.

    Args:
        logits: float [N, C], N >= 1 (bf16/fp16 are upcast to float32 for the loss; the gradient comes back in
            the logits' dtype).
        targets: int64 [N], every entry in [0, C) (no ignore index: select the scored rows first).
    Returns:
        (loss: 0-d float, equal to ``F.cross_entropy(logits, targets)``; accuracy: 0-d float in [0, 1], detached,
        the fraction of rows whose argmax is the target).
    Raises:
        ValueError: if ``logits`` is not 2-d with one row per target.
    """
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"cross_entropy_with_accuracy needs logits [N, C] and targets [N]; got "
            f"{tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    loss, argmax = _CrossEntropyWithArgmax.apply(logits, targets)
    return loss, (argmax == targets).float().mean()


__all__ = ["dropout", "Dropout", "cross_entropy_with_accuracy"]
