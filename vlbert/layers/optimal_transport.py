"""Optimal transport between the words and the regions of an image-text pair: UNITER's word-region alignment
(WRA, Chen et al. 2020 section 3.2), solved with IPOT, the inexact proximal point method of Xie et al. 2019
("A Fast Proximal Point Method for Computing Exact Wasserstein Distance", algorithm 1).

IPOT minimises <C, T> over transport plans T with marginals mu (uniform over the real words) and nu (uniform over
the real regions) by proximal steps T <- argmin <C, T> + beta * KL(T || T_prev), each solved inexactly by ``k``
Sinkhorn iterations on the kernel exp(-C / beta) * T_prev. Unlike entropic Sinkhorn it converges to the exact
optimal-transport distance as the iterations grow, for any beta (tests/objectives/test_word_region_alignment.py checks it
against the exact linear program of the POT package). UNITER (``model/ot.py`` at 1dbfa62) runs beta = 0.5,
50 iterations, k = 1, on the cosine distance, in float32, the plan held constant for the gradient.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)


def cosine_cost(x: torch.Tensor, y: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Cosine distance 1 - cos(x_i, y_j) of every pair. x float [B, M, D], y float [B, N, D] -> float [B, M, N],
    in [0, 2]."""
    return 1.0 - F.normalize(x, dim=-1, eps=eps) @ F.normalize(y, dim=-1, eps=eps).transpose(1, 2)


@torch.no_grad()
def ipot(
    cost: torch.Tensor,
    x_mask: torch.Tensor,
    y_mask: torch.Tensor,
    beta: float = 0.5,
    iterations: int = 50,
    k: int = 1,
    graph: bool | None = None,
) -> torch.Tensor:
    """The IPOT transport plan between uniform masses on the real x (rows) and the real y (columns).

    Args:
        cost: float [B, M, N] (computed in float32 whatever its dtype).
        x_mask, y_mask: [B, M], [B, N], 1/True = real (a padded row or column carries no mass).
        beta: the proximal step size (UNITER 0.5); iterations: proximal steps (UNITER 50); k: Sinkhorn
            iterations per step (UNITER 1).
        graph: replay the loop as one captured CUDA graph (:class:`CapturedIPOT`: a few launches instead of
            ~7 per iteration); None (default) = on a real CUDA device, False = the eager loop (the reference).
    Returns:
        float32 [B, M, N], each row of a real x summing to 1/M_real and each column of a real y to 1/N_real (at
        convergence), zero on padding.
    Raises:
        ValueError: mismatched shapes, or (masks on the CPU) a pair with no real x or no real y. Masks on a GPU
        are not read (that would stop the host): there such a pair gets an all-zero plan.
    """
    b, m, n = cost.shape
    if x_mask.shape != (b, m) or y_mask.shape != (b, n):
        raise ValueError(f"masks {tuple(x_mask.shape)}, {tuple(y_mask.shape)} do not fit the cost {tuple(cost.shape)}")
    if (
        x_mask.device.type == "cpu"
        and y_mask.device.type == "cpu"
        and not (x_mask.bool().any(1).all() and y_mask.bool().any(1).all())
    ):
        raise ValueError("every pair needs at least one real word and one real region")
    with torch.autocast(cost.device.type, enabled=False):  # float32 whatever the caller's autocast
        if graph is None:
            graph = CapturedIPOT.usable(cost)
        # never inside torch.compile: dynamo drops this branch as it traces (is_compiling() is True there) and
        # compiles the loop, instead of importing torch._dynamo at import time for a torch.compiler.disable
        if graph and not torch.compiler.is_compiling():
            return _CAPTURED(cost, x_mask, y_mask, beta, iterations, k)
        return ipot_loop(cost, x_mask, y_mask, beta, iterations, k)


def ipot_loop(
    cost: torch.Tensor, x_mask: torch.Tensor, y_mask: torch.Tensor, beta: float, iterations: int, k: int
) -> torch.Tensor:
    """The eager IPOT loop of :func:`ipot` (no checks), in as few ATen ops as the recurrence allows: 7 kernels per
    iteration at ``k`` = 1 (two matrix-vector products that add the 1e-30 floor in the same kernel, two
    divisions, three in-place products), the scaling vectors kept as [B, M, 1] / [B, N, 1] columns so that no
    reshape sits between them. The same recurrence as Xie et al. 2019 algorithm 1 and UNITER's ``ipot``
    (``model/ot.py`` at 1dbfa62): q = K * T; delta = mu / (q sigma); sigma = nu / (q^T delta); T = delta q sigma^T;
    equal to the previous form of this function (clamp_min(1e-30) where this adds 1e-30) within float32
    rounding (tests/objectives/test_word_region_alignment.py)."""
    cost = cost.float()
    xf, yf = x_mask.float(), y_mask.float()
    mu = (xf / xf.sum(1, keepdim=True).clamp_min(1))[:, :, None]  # [B, M, 1]
    nu = (yf / yf.sum(1, keepdim=True).clamp_min(1))[:, :, None]  # [B, N, 1]
    joint = xf[:, :, None] * yf[:, None, :]
    kernel = torch.exp(cost / -beta).mul_(joint)  # exp(-C / beta), zero on padding
    floor = cost.new_full((1, 1, 1), 1e-30)  # a padded row's sum: 0 -> 1e-30, no 0 / 0
    plan, q, sigma = joint, kernel.clone(), nu  # q = K * T_0 with T_0 = joint
    for step in range(iterations):
        if step:
            q = plan.mul_(kernel)
        for _ in range(k):
            delta = mu / torch.baddbmm(floor, q, sigma)
            sigma = nu / torch.baddbmm(floor, q.transpose(1, 2), delta)
        plan = q.mul_(delta).mul_(sigma.transpose(1, 2))
    return plan.mul_(joint) if iterations else joint


class CapturedIPOT:
    """:func:`ipot_loop` captured once per problem size as a CUDA graph (``torch.cuda.CUDAGraph``) and replayed:
    the 50 iterations' ~350 kernels launched by one call, the eager loop's kernels in its order at the graph's size.

    Sizes are rounded up (M and N to a multiple of ``multiple``) to bound the number of graphs; the added rows and
    columns carry no mass, so the plan on the real ones is the exact size's up to float32 rounding: the replay equals
    the eager loop on the zero-padded problem bit for bit, and the eager loop at the exact size within rounding (a
    matrix-vector kernel chosen for the longer rows may sum the same terms in another order). The ``max_graphs`` most
    recently used are kept (each holds a few [B, M, N] float32 buffers: ~50 MB at 320 pairs x 64 words x 112
    regions). A call copies the inputs into the graph's static buffers, replays it and clones the plan's real part
    out: 7 launches and one replay. A capture that fails (a driver, a debugging mode) logs once and leaves this
    process on the eager loop. Sources: PyTorch's CUDA Graphs notes ("Whole-network capture" and "Partial-network
    capture", torch 2.14).
    """

    def __init__(self, multiple: int = 16, max_graphs: int = 32):
        self.multiple, self.max_graphs = multiple, max_graphs
        self.graphs: OrderedDict = OrderedDict()
        self.failed = False

    @staticmethod
    def usable(cost: torch.Tensor) -> bool:
        """Whether ``cost`` is a plain tensor on a real CUDA device with nothing tracing it (no dispatch mode such
        as a fake-tensor trace, not inside torch.compile or another capture)."""
        return (
            type(cost) is torch.Tensor
            and cost.is_cuda
            and not _CAPTURED.failed
            and torch._C._len_torch_dispatch_stack() == 0
            and not torch.compiler.is_compiling()
            and not torch.cuda.is_current_stream_capturing()
        )

    def __call__(self, cost, x_mask, y_mask, beta: float, iterations: int, k: int) -> torch.Tensor:
        b, m, n = cost.shape
        key = (
            cost.device,
            b,
            -(-m // self.multiple) * self.multiple,
            -(-n // self.multiple) * self.multiple,
            beta,
            iterations,
            k,
        )
        entry = self.graphs.get(key)
        if entry is None:
            try:
                entry = self._capture(key)
            except RuntimeError as error:  # (torch.cuda.graph raises RuntimeError for what it cannot capture)
                logger.warning("IPOT: CUDA graph capture failed (%s); using the eager loop", error)
                self.failed = True
                return ipot_loop(cost, x_mask, y_mask, beta, iterations, k)
            self.graphs[key] = entry
            while len(self.graphs) > self.max_graphs:
                self.graphs.popitem(last=False)
        self.graphs.move_to_end(key)
        graph, static_cost, static_x, static_y, plan = entry
        for static, value in ((static_x, x_mask), (static_y, y_mask), (static_cost, cost)):
            static.zero_()  # the padding: no mass, and no stale cost (a NaN there would outlive its batch)
            static[(slice(None), *map(slice, value.shape[1:]))].copy_(value)
        graph.replay()
        return plan[:, :m, :n].clone()

    @staticmethod
    def _capture(key) -> tuple:
        """Capture the loop at ``key``'s size on zero-cost inputs with no mass (warmed up on a side stream first,
        as the notes ask); returns (graph, static cost, static masks, the static plan)."""
        device, b, m, n, beta, iterations, k = key
        static_cost = torch.zeros(b, m, n, device=device)  # zeros, not empty: padding must stay finite
        static_x = torch.zeros(b, m, device=device)
        static_y = torch.zeros(b, n, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            ipot_loop(static_cost, static_x, static_y, beta, iterations, k)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(device), torch.cuda.graph(graph, capture_error_mode="thread_local"):
            plan = ipot_loop(static_cost, static_x, static_y, beta, iterations, k)
        return graph, static_cost, static_x, static_y, plan


_CAPTURED = CapturedIPOT()


def wasserstein_distance(
    x: torch.Tensor,
    y: torch.Tensor,
    x_mask: torch.Tensor,
    y_mask: torch.Tensor,
    beta: float = 0.5,
    iterations: int = 50,
    k: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
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


__all__ = ["cosine_cost", "ipot", "ipot_loop", "CapturedIPOT", "wasserstein_distance"]
