"""Rotary position embeddings (RoPE) on the unpadded token layout.

Su et al. 2021, "RoFormer", section 3.4: a query or key at position m has each pair of its head dimensions rotated
by the angle m * theta^(-2i/d), so that q_m . k_n depends on m - n alone. The pairing is the "rotate half" one of
GPT-NeoX and transformers (dimension i pairs with i + d/2: ``rotate_half`` in transformers'
``models/modernbert/modeling_modernbert.py`` at v5.24.0), which ModernBERT's checkpoints were trained with. Angles,
cosines and the rotation are computed in float32 whatever the hidden states' dtype, as there.
"""

from __future__ import annotations

import torch

from vlbert.layers.unpadded import Unpadding


def token_positions(unpadding: Unpadding) -> torch.Tensor:
    """int64 [N]: the position of each unpadded token, its column in the padded [B, S] batch (transformers'
    default ``position_ids``, ``arange(S)`` in every row). Computed on the device, no host sync."""
    if unpadding.indices is None:
        return torch.arange(unpadding.batch * unpadding.seq, device=unpadding.cu_seqlens.device) % unpadding.seq
    return unpadding.indices % unpadding.seq


def rotary_angles(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), float32 [N, head_dim] each: the rotation of every token at ``positions`` (int [N]) with base
    ``theta`` (ModernBERT: 160,000 in global layers, 10,000 in local ones), each angle repeated for the two halves
    of the head."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    freqs = positions.float()[:, None] * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` float [N, heads, head_dim] (queries or keys) by ``cos``/``sin`` [N, head_dim]
    (:func:`rotary_angles`): x * cos + rotate_half(x) * sin in float32. Returns the same shape and dtype."""
    y = x.float()
    half = y.shape[-1] // 2
    rotated = torch.cat((-y[..., half:], y[..., :half]), dim=-1)
    return (y * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


__all__ = ["token_positions", "rotary_angles", "apply_rotary"]
