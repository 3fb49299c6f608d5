"""Optimal transport between the words and the regions of an image-text pair: UNITER's word-region alignment
(WRA, Chen et al. 2020 section 3.2), solved with IPOT, the inexact proximal point method of Xie et al. 2019
("A Fast Proximal Point Method for Computing Exact Wasserstein Distance", algorithm 1).

IPOT minimises <C, T> over transport plans T with marginals mu (uniform over the real words) and nu (uniform over
the real regions) by proximal steps T <- argmin <C, T> + beta * KL(T || T_prev), each solved inexactly by ``k``
Sinkhorn iterations on the kernel exp(-C / beta) * T_prev. Unlike entropic Sinkhorn it converges to the exact
optimal-transport distance as the iterations grow, for any beta (tests/test_word_region_alignment.py checks it
against the exact linear program of the POT package). UNITER (``model/ot.py`` at 1dbfa62) runs beta = 0.5,
50 iterations, k = 1, on the cosine distance, in float32, the plan held constant for the gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cosine_cost(x: torch.Tensor, y: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Cosine distance 1 - cos(x_i, y_j) of every pair. x float [B, M, D], y float [B, N, D] -> float [B, M, N],
    in [0, 2]."""
    return 1.0 - F.normalize(x, dim=-1, eps=eps) @ F.normalize(y, dim=-1, eps=eps).transpose(1, 2)


@torch.no_grad()
def ipot(cost: torch.Tensor, x_mask: torch.Tensor, y_mask: torch.Tensor, beta: float = 0.5,
         iterations: int = 50, k: int = 1) -> torch.Tensor:
    """The IPOT transport plan between uniform masses on the real x (rows) and the real y (columns).

    Args:
        cost: float [B, M, N] (computed in float32 whatever its dtype).
        x_mask, y_mask: [B, M], [B, N], 1/True = real (a padded row or column carries no mass).
        beta: the proximal step size (UNITER 0.5); iterations: proximal steps (UNITER 50); k: Sinkhorn
            iterations per step (UNITER 1).
    Returns:
        float32 [B, M, N], each row of a real x summing to 1/M_real and each column of a real y to 1/N_real (at
        convergence), zero on padding.
    Raises:
        ValueError: mismatched shapes, or a pair with no real x or no real y.
    """
    b, m, n = cost.shape
    if x_mask.shape != (b, m) or y_mask.shape != (b, n):
        raise ValueError(f"masks {tuple(x_mask.shape)}, {tuple(y_mask.shape)} do not fit the cost {tuple(cost.shape)}")
    xm, ym = x_mask.bool(), y_mask.bool()
    if not (xm.any(1).all() and ym.any(1).all()):
        raise ValueError("every pair needs at least one real word and one real region")
    cost = cost.float()
    joint = (xm[:, :, None] & ym[:, None, :]).float()
    mu = xm.float() / xm.sum(1, keepdim=True)       # [B, M]
    nu = ym.float() / ym.sum(1, keepdim=True)       # [B, N]
    kernel = torch.exp(-cost / beta) * joint
    plan = joint.clone()
    sigma = nu.clone()
    for _ in range(iterations):
        q = kernel * plan
        for _ in range(k):
            delta = mu / (q @ sigma[:, :, None]).squeeze(2).clamp_min(1e-30)
            sigma = nu / (q.transpose(1, 2) @ delta[:, :, None]).squeeze(2).clamp_min(1e-30)
        plan = delta[:, :, None] * q * sigma[:, None, :]
    return plan * joint


def wasserstein_distance(x: torch.Tensor, y: torch.Tensor, x_mask: torch.Tensor, y_mask: torch.Tensor,
                         beta: float = 0.5, iterations: int = 50, k: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The optimal-transport distance <C, T*> between the words x and the regions y of each pair, under the cosine
    cost, with the IPOT plan T* held constant (UNITER's WRA: gradients reach both x and y through C only).

    Args:
        x: float [B, M, D] (e.g. contextual word embeddings); y: float [B, N, D] (contextual region embeddings).
        x_mask, y_mask: [B, M], [B, N], 1 = real.
        beta, iterations, k: see :func:`ipot`.
    Returns:
        (distance float32 [B], in [0, 2]; plan float32 [B, M, N], for inspection). Computed in float32 under any
        autocast.
    Raises:
        ValueError: as :func:`ipot`.
    """
    with torch.autocast(x.device.type, enabled=False):
        cost = cosine_cost(x.float(), y.float())
        plan = ipot(cost.detach(), x_mask, y_mask, beta, iterations, k)
        return (cost * plan).sum((1, 2)), plan


__all__ = ["cosine_cost", "ipot", "wasserstein_distance"]
