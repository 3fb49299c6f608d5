"""bf16 parameters trained through float32 master weights (``training.mixed_precision: bf16-params``).

Source: Micikevicius et al. 2018, "Mixed precision training", section 3.1 (an FP32 master copy of the weights
receives the update; the model computes in half precision); MosaicBERT and most large-model trainers keep bf16
weights the same way. Compared with autocast over float32 parameters, nothing is cast inside the step: autocast
casts every weight and bias before each Linear and LayerNorm and their gradients back (four extra operations per
Linear: half of a BERT layer's operations, each costing the host ~30 us to launch on the GPU). Predicted by
../shared/gpu/roofline.py for BERT-base 256 x 128 on an H100: 46.8 ms with bf16 parameters vs 49.5 ms with autocast;
for the UNITER-sized VL step 572 vs 896 operations.

The optimizer holds the float32 masters (its state is theirs, so checkpoints and exact resume are as in float32
training); after each backward the bf16 gradients (already averaged across processes by DDP) are copied into the
masters' float32 gradients, clipped and stepped there, and the masters are copied back into the bf16 weights.
Checkpoints write the masters (:meth:`MasterWeights.float32_model`), never the rounded weights.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


class MasterWeights:
    """Float32 masters of a model's parameters; the model itself is cast to ``dtype`` (bf16).

    Args:
        model: a float32 module; after construction its floating parameters and buffers are ``dtype``.
        dtype: the computing dtype (torch.bfloat16).
    Attributes:
        masters: list of float32 leaf tensors (requires_grad), one per parameter of ``model`` in
            ``model.parameters()`` order; build the optimizer over these (:meth:`groups`).
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16):
        self.params = list(model.parameters())
        self.masters = [p.detach().clone().float().requires_grad_(p.requires_grad) for p in self.params]
        self._by_id = {id(p): m for p, m in zip(self.params, self.masters)}
        self._buffers: list[torch.Tensor] | None = None
        model.to(dtype)

    def groups(self, groups: list[dict]) -> list[dict]:
        """Optimizer parameter groups over the model's parameters -> the same groups over their masters."""
        return [{**g, "params": [self._by_id[id(p)] for p in g["params"]]} for g in groups]

    @torch.no_grad()
    def gradients_to_masters(self) -> None:
        """masters' .grad = float32 copies of the model's gradients, in one fused copy into buffers allocated once
        (None where the model's is None: the optimizer then skips the parameter, as it would the model's); the
        model's gradients are released."""
        if self._buffers is None:
            self._buffers = [torch.empty_like(m) for m in self.masters]
        present = [i for i, p in enumerate(self.params) if p.grad is not None]
        if present:
            torch._foreach_copy_([self._buffers[i] for i in present], [self.params[i].grad for i in present])
        for i, (p, m) in enumerate(zip(self.params, self.masters)):
            m.grad = self._buffers[i] if p.grad is not None else None
            p.grad = None

    @torch.no_grad()
    def masters_to_model(self) -> None:
        """Round the updated masters into the model's weights (one fused copy)."""
        torch._foreach_copy_(self.params, self.masters)

    @contextlib.contextmanager
    def float32_model(self):
        """Within the block the model's parameters *are* the float32 masters (shared storage): saving writes the
        masters, loading writes into them. On exit the weights are the masters rounded to the model's dtype."""
        kept = [p.data for p in self.params]
        try:
            for p, m in zip(self.params, self.masters):
                p.data = m.data
            yield
        finally:
            for p, data in zip(self.params, kept):
                p.data = data
            self.masters_to_model()


__all__ = ["MasterWeights"]
