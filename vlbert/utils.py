"""Small helpers shared across the library."""

from __future__ import annotations

from accelerate.utils import gather, pad_across_processes


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


def all_gather_padded(tensors: list) -> list:
    """Every process's tensors, concatenated along dim 0 in rank order (ranks may hold different batch sizes,
    and 2-d tensors different lengths along dim 1: those are right-padded with 0 to the longest). The tensors
    themselves when not distributed. For choices over the global batch (hard negatives). accelerate's
    ``pad_across_processes`` and ``gather`` do the work (each reads the sizes on the host: a sync per call)."""
    import torch

    rank, world = process_position()
    if world == 1:
        return list(tensors)
    rows = gather(torch.tensor([tensors[0].shape[0]], device=tensors[0].device)).tolist()
    out = []
    for t in tensors:
        padded = pad_across_processes(pad_across_processes(t, dim=1) if t.dim() > 1 else t, dim=0)
        parts = gather(padded).split(padded.shape[0])
        out.append(torch.cat([part[:n] for part, n in zip(parts, rows, strict=True)]))
    return out


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
