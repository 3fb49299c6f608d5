"""The two-layer classifier of the VL fine-tuning heads: Linear -> GELU -> LayerNorm -> Linear.

This is the answer classifier of bottom-up/top-down VQA models as UNITER and LXMERT use it (UNITER
``model/vqa.py``; Anderson et al. 2018 section 3.3, with GELU and LayerNorm as in BERT's own heads). VQA, NLVR2 and
referring expressions build theirs here, so the layer order and the state-dict keys (``0.weight`` ..
``3.bias``, those of an ``nn.Sequential``) are the same everywhere and checkpoints keep loading.
"""

from __future__ import annotations

from torch import nn


def mlp_head(in_dim: int, hidden_dim: int, out_dim: int, layer_norm_eps: float = 1e-12) -> nn.Sequential:
    """``Linear(in_dim, hidden_dim) -> GELU -> LayerNorm(hidden_dim) -> Linear(hidden_dim, out_dim)``.

    Maps float [..., in_dim] to float [..., out_dim] (logits or scores). Keys: ``0`` (first Linear), ``2``
    (LayerNorm), ``3`` (output Linear).
    """
    return nn.Sequential(
        nn.Linear(in_dim, hidden_dim),
        nn.GELU(),
        nn.LayerNorm(hidden_dim, eps=layer_norm_eps),
        nn.Linear(hidden_dim, out_dim),
    )


__all__ = ["mlp_head"]
