"""Small helpers shared across the library."""

from __future__ import annotations

import dataclasses


def evaluation(fn):
    """Decorator for functions taking a ``model`` argument: run under ``torch.no_grad()`` with the model in eval
    mode, and give the model back in the mode it was in."""
    import functools
    import inspect

    import torch

    position = list(inspect.signature(fn).parameters).index("model")

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        model = kwargs["model"] if "model" in kwargs else args[position]
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                return fn(*args, **kwargs)
        finally:
            model.train(was_training)

    return wrapper


def forward_arguments(model) -> set[str]:
    """The batch keys ``model``'s ``forward`` takes: its parameters by name (the collator's ``layout`` among them),
    its ``input_names`` (a vision-language model's: the fields of :class:`~vlbert.models.inputs.VLInputs`, taken as
    keywords) and its ``label_names`` (a model whose forward reads its labels as keyword arguments). What the trainer
    and a task's own prediction pass give the model of a batch; bookkeeping entries (``index``, the objective's
    name) stay out."""
    import inspect

    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = [p.name for p in inspect.signature(model.forward).parameters.values() if p.kind in named]
    return {*params, *getattr(model, "input_names", ()), *getattr(model, "label_names", ())}


def process_position() -> tuple[int, int]:
    """(rank, world size) of this process in data-parallel training; (0, 1) when not distributed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@dataclasses.dataclass(frozen=True)
class GatherBounds:
    """What any rank's batch can hold, known on every rank without asking the others: the shapes
    :func:`all_gather_padded` pads to.

    Attributes:
        rows: the per-device batch size (every batch a rank collates has at most this many items).
        text: the text positions of any batch: the collator's maximum text length ([CLS]/[SEP] included) rounded up
            to its padding multiple.
        regions: the regions of any batch (the run's ``max_regions``).
    """

    rows: int
    text: int
    regions: int


def all_gather_padded(tensors: list, rows: int, widths: list | None = None, local: bool = False) -> tuple[list, object]:
    """Every process's ``tensors``, in rank order, each rank's rows padded to ``rows``, without a host read: for
    choices over the global batch (hard negatives, contrastive columns of an uneven evaluation batch).

    Args:
        tensors: each [b, ...] on this rank's device (b the same for all, at most ``rows``); dim 1 may differ
            between ranks where ``widths`` bounds it.
        rows: the most rows any rank holds (:attr:`GatherBounds.rows`).
        widths: per tensor, the length its dim 1 is right-padded to with 0 (:attr:`GatherBounds.text`,
            :attr:`GatherBounds.regions`), or None where every rank's dim 1 is equal (an embedding size).
        local: this rank's tensors alone, as in one process (evaluation: the trainer deals the held-out batches
            round-robin, so ranks run different numbers of them and a collective would wait forever).
    Returns:
        (the gathered tensors: [world x rows, ...] each, rank r's rows at ``r * rows``, padding 0; ``valid``: bool
        [world x rows] on the device, True at the real rows). One process: the tensors themselves and ``valid``
        all True ([b]). Sizes are the bounds, known to every rank: nothing is read back, and ``valid`` is
        gathered on the device, so the host waits for nothing (accelerate's ``pad_across_processes`` reads every
        rank's size first).
    Raises:
        ValueError: a tensor with more rows than ``rows`` or longer than its width (the bounds are wrong), or
            tensors of different row counts.
    Source: torch.distributed ``all_gather`` (one collective per tensor).
    """
    import torch
    import torch.nn.functional as F

    b = tensors[0].shape[0]
    device = tensors[0].device
    if any(t.shape[0] != b for t in tensors):
        raise ValueError(f"all_gather_padded: tensors of {[t.shape[0] for t in tensors]} rows; they must agree")
    _, world = process_position()
    if world == 1 or local:
        return list(tensors), torch.ones(b, dtype=torch.bool, device=device)
    widths = widths or [None] * len(tensors)
    if b > rows:
        raise ValueError(f"all_gather_padded: {b} rows, more than the bound {rows} (the per-device batch size)")
    out = []
    for t, width in zip(tensors, widths, strict=True):
        pad = [0, 0] * (t.dim() - 1) + [0, rows - b]
        if width is not None:
            if t.shape[1] > width:
                raise ValueError(f"all_gather_padded: dim 1 of {tuple(t.shape)} is longer than its bound {width}")
            pad[-3] = width - t.shape[1]
        out.append(all_gather_equal(F.pad(t, pad)))
    valid = torch.arange(rows, device=device) < b
    return out, all_gather_equal(valid.to(torch.uint8)).bool()


def all_gather_equal(t):
    """``t`` [n, ...] of every process concatenated along dim 0 in rank order ([world x n, ...]; every rank's ``t`` of
    one shape and dtype, on its device), without gradient and without a host read; ``t`` itself in one process.

    Source: ``torch.distributed.all_gather`` (gloo on CPU tensors, NCCL on CUDA ones)."""
    import torch
    import torch.distributed as dist

    _, world = process_position()
    if world == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, 0)


def glibc():
    """The process's GNU C library as a ``ctypes.CDLL``, or None where the C library is not glibc (macOS, musl,
    Windows) or cannot be loaded. For malloc tuning and statistics (``mallopt``, ``mallinfo2``)."""
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def keep_freed_memory_in_process() -> bool:
    """Make glibc's ``malloc`` reuse freed memory instead of returning it to the kernel (CPU training speed).

    glibc serves every allocation above ``M_MMAP_THRESHOLD`` (at most 32 MiB) with a fresh ``mmap`` and unmaps it
    on free, so each training step page-faults its large activations (e.g. the [masked tokens, 30,522] MLM logits)
    in again and the kernel zero-fills every page. This sets ``M_MMAP_MAX = 0`` (serve large blocks from the heap
    too) and ``M_TRIM_THRESHOLD = 1 GiB`` (do not shrink the heap), the runtime equivalent of the
    ``MALLOC_MMAP_MAX_`` / ``MALLOC_TRIM_THRESHOLD_`` environment variables; PyTorch's CPU tuning guide reaches
    the same end by preloading jemalloc or tcmalloc. The cost: freed memory stays reserved by the process
    (docs/performance.md has both sides measured).

    Returns True when the settings were applied, False where the C library is not glibc (no change made).
    Affects every allocation made afterwards in this process (the CUDA caching allocator is unaffected).
    """
    libc = glibc()
    if libc is None:
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # malloc.h
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))
