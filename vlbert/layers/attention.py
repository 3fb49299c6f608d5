"""Attention kernels as a table, over the unpadded token layout of :mod:`vlbert.layers.unpadded`.

The encoder keeps its hidden states *unpadded*: the N real tokens (and regions) of a padded [B, S] batch as one
[N, H] matrix (MosaicBERT / MLPerf BERT "unpadding"), built once before the first layer and padded back once after
the last (:class:`~vlbert.layers.unpadded.Unpadding`). Position-wise layers never see padding; attention is the one
place that needs the sequence boundaries, and each entry of :data:`ATTENTION_FUNCTIONS` reads them its own way:

* ``eager``: softmax(q k^T / sqrt(d) + mask) v written out (the reference; it alone returns the probabilities);
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` on the padded [B, heads, S, d] batch;
* ``varlen``: variable-length attention on the unpadded tokens and ``cu_seqlens`` (no padding anywhere). On CUDA the
  flash-attention kernel behind ``torch.nn.attention.varlen.varlen_attn``, called with the attention-probability
  dropout BERT trains with (``varlen_attn`` itself has none: see :class:`_FlashVarlen`); on other devices a
  per-sequence reference over the same unpadded layout. Why keep the dropout: BERT (appendix A.2) and UNITER
  (``attention_probs_dropout_prob`` 0.1 in its configs) train with it; MosaicBERT set it to 0 because its Triton
  flash kernel had none, a recipe change, not a kernel property. A run that wants MosaicBERT's recipe sets
  ``model.attention_probs_dropout_prob: 0``.

Every function has one signature, ``fn(q, k, v, unpadding, dropout_p, training, output_attentions=False) -> (out,
probs)``: q, k, v float [N, heads, head_dim] unpadded, ``unpadding`` the :class:`~vlbert.layers.unpadded.Unpadding`,
``dropout_p`` the attention-probability dropout applied when ``training``, ``output_attentions`` whether to return
the probabilities; ``out`` the same layout as q, ``probs`` [B, heads, S, S] or None. A kernel declared
``cross_attention`` (the three above) also takes ``kv_unpadding``, the layout of k and v when it is not q's: a
two-stream model's cross-attention, one stream's queries over the other's keys. A new kernel is one
function and one line in the table (:func:`register_attention`), as transformers' ``AttentionInterface``, declaring
its layout and when it can run (:class:`AttentionKernel`). The model config names it (``attn_implementation``,
transformers' key); ``None`` picks ``varlen`` on CUDA in bf16/fp16 and ``sdpa`` elsewhere, and a kernel that cannot
run falls back (:func:`select_attention`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from vlbert.layers.kernels import dropout
from vlbert.layers.unpadded import Unpadding
from vlbert.layers.unpadded import legacy_fields as packing_fields  # noqa: F401  (LEGACY_KEYS' one caller)

logger = logging.getLogger(__name__)


def _padded(q: torch.Tensor, unpadding: Unpadding) -> torch.Tensor:
    """[N, heads, d] -> [B, heads, S, d] (zeros at padding)."""
    return unpadding.pad(q).transpose(1, 2)


def _unpadded(y: torch.Tensor, unpadding: Unpadding) -> torch.Tensor:
    """[B, heads, S, d] -> [N, heads, d]."""
    return unpadding.unpad(y.transpose(1, 2))


def _explicit(q, k, v, key_mask, dropout_p, training, keep_probs):
    """softmax(q k^T / sqrt(d) + mask) with :func:`dropout`, times v; q, k, v [..., S, d]; key_mask bool
    [..., 1, S] or None. Returns (out, the dropped probabilities or None)."""
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(q.shape[-1] ** -0.5)
    if key_mask is not None:
        scores = scores.masked_fill_(~key_mask, torch.finfo(scores.dtype).min)
    probs = dropout(torch.softmax(scores, -1), dropout_p, training)
    return torch.matmul(probs, v), (probs if keep_probs else None)


def _band(length: int, window: int, device) -> torch.Tensor:
    """bool [L, L]: True where query i may attend to key j, |i - j| <= ``window`` (a bidirectional sliding window of
    ``window`` positions on each side)."""
    i = torch.arange(length, device=device)
    return (i[:, None] - i[None, :]).abs() <= window


def _key_mask(unpadding: Unpadding, kv_unpadding: Unpadding | None, window: int | None = None) -> torch.Tensor | None:
    """The padded kernels' key mask: ``unpadding``'s, or for cross-attention the key stream's, where a row with no
    real key (its regions all masked out) attends to its padding instead: zeros where that stream is unpadded, so its
    output is 0, as the unpadded kernels give a row without keys. With ``window`` (self-attention only) a bool
    [B, 1, S, S] mask that also keeps each real query to the keys within ``window`` columns of it; a padded query
    keeps every real key (its row is never read, and a row without keys would not be finite)."""
    if window is not None:
        band = _band(unpadding.seq, window, unpadding.cu_seqlens.device)[None, None]
        if unpadding.mask is None:
            return band
        return unpadding.key_mask() & (band | ~unpadding.mask[:, None, :, None])
    if kv_unpadding is None:
        return unpadding.key_mask()
    mask = kv_unpadding.key_mask()
    return None if mask is None else mask | ~mask.any(-1, keepdim=True)


def eager_attention(
    q,
    k,
    v,
    unpadding: Unpadding,
    dropout_p: float,
    training: bool,
    output_attentions: bool = False,
    kv_unpadding: Unpadding | None = None,
    window: int | None = None,
):
    """The reference: scores, softmax, :func:`~vlbert.layers.kernels.dropout`, times v, on the padded batch
    (transformers' eager attention). Returns the probabilities [B, heads, S, S] (after dropout, the weights that
    multiply v, rows of padded queries included) when ``output_attentions``; [B, heads, S, S_kv] for
    cross-attention (``kv_unpadding``). ``window``: a query attends only to keys at most that many positions away
    (ModernBERT's local layers; self-attention only)."""
    kv = unpadding if kv_unpadding is None else kv_unpadding
    y, probs = _explicit(
        _padded(q, unpadding),
        _padded(k, kv),
        _padded(v, kv),
        _key_mask(unpadding, kv_unpadding, window),
        dropout_p,
        training,
        output_attentions,
    )
    return _unpadded(y, unpadding), probs


def sdpa_attention(
    q,
    k,
    v,
    unpadding: Unpadding,
    dropout_p: float,
    training: bool,
    output_attentions: bool = False,
    kv_unpadding: Unpadding | None = None,
    window: int | None = None,
):
    """``scaled_dot_product_attention`` on the padded batch with a boolean key mask (with ``window``, the [B, 1, S,
    S] mask of :func:`eager_attention`'s window). CPU training with dropout runs :func:`eager_attention` instead
    (SDPA's CPU dropout path, the math kernel with ``bernoulli_``, is slower)."""
    if output_attentions or (training and dropout_p > 0 and q.device.type == "cpu"):
        return eager_attention(q, k, v, unpadding, dropout_p, training, output_attentions, kv_unpadding, window)
    kv = unpadding if kv_unpadding is None else kv_unpadding
    y = F.scaled_dot_product_attention(
        _padded(q, unpadding),
        _padded(k, kv),
        _padded(v, kv),
        attn_mask=_key_mask(unpadding, kv_unpadding, window),
        dropout_p=dropout_p if training else 0.0,
    )
    return _unpadded(y, unpadding), None


class _FlashVarlen(torch.autograd.Function):
    """Flash attention over unpadded sequences with attention-probability dropout: ATen's
    ``_flash_attention_forward`` / ``_flash_attention_backward``, the kernels ``varlen_attn`` calls with dropout 0.
    The forward returns the Philox seed and offset of its dropout mask; the backward regenerates the same mask from
    them (FlashAttention-2, Dao 2023, section 3.1). Queries and keys have their own ``cu_seqlens`` and maximum
    length (the same for self-attention; a two-stream model's cross-attention: one stream's queries over the
    other's keys; a sequence without keys gets a zero output, the forward kernel exiting early with zeros:
    Dao-AILab/flash-attention ``csrc/flash_attn/src/flash_fwd_kernel.h``, ``compute_attn_1rowblock``). ``window``:
    keys at most that many positions from the query on either side (the kernels' ``window_size_left`` /
    ``window_size_right``). Needs CUDA (sm80+) and bf16/fp16 inputs."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, window=None):
        sides = {} if window is None else {"window_size_left": window, "window_size_right": window}
        out, lse, seed, offset, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, False, False, **sides
        )
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seed, offset)
        ctx.max_q, ctx.max_k, ctx.dropout_p, ctx.sides = max_q, max_k, dropout_p, sides
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        q, k, v, out, lse, cu_q, cu_k, seed, offset = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad.contiguous(),
            q,
            k,
            v,
            out,
            lse,
            cu_q,
            cu_k,
            ctx.max_q,
            ctx.max_k,
            ctx.dropout_p,
            False,
            seed,
            offset,
            **ctx.sides,
        )
        return dq, dk, dv, None, None, None, None, None, None


def varlen_attention(
    q,
    k,
    v,
    unpadding: Unpadding,
    dropout_p: float,
    training: bool,
    output_attentions: bool = False,
    kv_unpadding: Unpadding | None = None,
    window: int | None = None,
):
    """Attention within each unpadded sequence (``unpadding.cu_seqlens``), never touching padding; with ``kv_unpadding``
    (cross-attention) sequence b's queries attend to the keys ``kv_unpadding.cu_seqlens`` gives sequence b. CUDA:
    flash attention (:class:`_FlashVarlen`, q/k/v in the autocast dtype). Elsewhere: each sequence's
    [1, heads, L, d] attention in turn (:func:`_explicit`, dropout included), the reference of the unpadded layout
    that the tests compare with ``eager``. With ``output_attentions`` it is :func:`eager_attention`. ``window``
    (self-attention): keys at most that many positions from the query."""
    if output_attentions:  # the probabilities exist only in the explicit path, as in transformers
        return eager_attention(q, k, v, unpadding, dropout_p, training, True, kv_unpadding, window)
    p = dropout_p if training else 0.0
    kv = unpadding if kv_unpadding is None else kv_unpadding
    if q.is_cuda:
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else q.dtype
        if dtype in (torch.float16, torch.bfloat16):
            q, k, v = (t.to(dtype) for t in (q, k, v))
            return _FlashVarlen.apply(
                q, k, v, unpadding.cu_seqlens, kv.cu_seqlens, unpadding.max_seqlen, kv.max_seqlen, p, window
            ), None
    queries, keys = unpadding.cu_seqlens.tolist(), kv.cu_seqlens.tolist()
    outs = []
    for (q0, q1), (k0, k1) in zip(
        zip(queries[:-1], queries[1:], strict=True), zip(keys[:-1], keys[1:], strict=True), strict=True
    ):
        seq = lambda t, a, b: t[a:b].transpose(0, 1)[None]  # [1, heads, L, d]
        band = None if window is None else _band(q1 - q0, window, q.device)
        outs.append(
            _explicit(seq(q, q0, q1), seq(k, k0, k1), seq(v, k0, k1), band, p, training, False)[0][0].transpose(0, 1)
        )
    return torch.cat(outs), None


AttentionFunction = Callable[..., tuple]
LOW_PRECISION = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class AttentionRequest:
    """What a forward asks of its attention kernel, for :meth:`AttentionKernel.unsupported`.

    Attributes: device (where q, k, v live), dtype (the dtype the kernel computes in: the autocast dtype under
    autocast, else the hidden states'), head_dim (int), dropout (the attention-probability dropout this forward
    applies: 0.0 in eval mode), output_attentions (whether the probabilities are wanted), window (None, or the
    sliding window, in positions on each side of a query, that a local layer attends within: ModernBERT's)."""

    device: torch.device
    dtype: torch.dtype
    head_dim: int
    dropout: float = 0.0
    output_attentions: bool = False
    window: int | None = None


def _always(request: AttentionRequest) -> str | None:
    return None


@dataclass(frozen=True)
class AttentionKernel:
    """An entry of :data:`ATTENTION_FUNCTIONS`: the function and what it needs.

    Attributes:
        function: ``fn(q, k, v, unpadding, dropout_p, training, output_attentions=False) -> (out, probs)`` (see
            the module docstring).
        layout: ``"unpadded"``: the kernel reads ``unpadding.cu_seqlens`` and must get the unpadded tokens, never a
            padded batch (the encoder then always unpads); ``"padded"``: it pads per call with ``unpadding.pad``
            and masks with ``unpadding.key_mask()``, so the encoder may keep a batch with little padding dense.
        returns_probabilities: whether ``probs`` comes back with ``output_attentions`` (else ``eager`` runs).
        unsupported: ``(AttentionRequest) -> None`` if the kernel can run the request, else the reason in a few
            words (device, dtype, head size, compute capability, dropout).
        fallback: the kernel to try when this one cannot run (``varlen`` -> ``sdpa`` -> ``eager``).
        cross_attention: whether ``function`` takes ``kv_unpadding`` (keys and values in another layout than the
            queries: :class:`~vlbert.models.two_stream.CrossAttention`); one that does not leaves the
            cross-attention to ``sdpa``.
        sliding_window: whether ``function`` takes ``window`` (a bidirectional sliding window: ModernBERT's local
            layers); a request with a window hands a kernel without one to its fallback, with one log line.
    Calling the entry calls ``function``.
    """

    function: AttentionFunction
    layout: str = "padded"
    returns_probabilities: bool = False
    unsupported: Callable[[AttentionRequest], str | None] = _always
    fallback: str | None = "sdpa"
    cross_attention: bool = False
    sliding_window: bool = False

    def __post_init__(self):
        if self.layout not in ("unpadded", "padded"):
            renamed = " ('packed' is now 'unpadded')" if self.layout == "packed" else ""
            raise ValueError(f"an attention kernel's layout is 'unpadded' or 'padded', not {self.layout!r}{renamed}")

    def __call__(self, *args, **kwargs):
        return self.function(*args, **kwargs)


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """The compute capability of a CUDA ``device`` (``torch.cuda.get_device_capability``)."""
    return torch.cuda.get_device_capability(device)


def flash_attention_impl() -> str | None:
    """The FlashAttention implementation behind PyTorch's flash kernels when another one was activated in this
    process (``torch.nn.attention.activate_flash_attention_impl``, e.g. ``"FA3"``), else None (the built-in
    FlashAttention-2)."""
    current = getattr(torch.nn.attention, "current_flash_attention_impl", None)
    return current() if current is not None else None


def flash_varlen_unsupported(request: AttentionRequest) -> str | None:
    """Why :func:`varlen_attention` cannot run ``request``, or None. Off CUDA it runs its per-sequence reference
    (always). On CUDA, PyTorch's flash kernels need: bf16/fp16 inputs, a build with flash attention
    (``torch.backends.cuda.is_flash_attention_available``), compute capability 8.0 or newer (Ampere; not a T4
    or V100), a head size that is a multiple of 8 and at most 256 (not TinyBERT's 26); and, with dropout, the
    built-in FlashAttention-2 (FlashAttention-3, when activated, has no dropout). Source: PyTorch 2.14
    ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` (check_flash_attention_hardware_support,
    check_head_dim_size_flash)."""
    if request.device.type != "cuda":
        return None
    if request.dtype not in LOW_PRECISION:
        return f"flash attention takes bf16/fp16, this forward computes in {request.dtype}"
    if not torch.backends.cuda.is_flash_attention_available():
        return "this PyTorch build has no flash attention"
    major, minor = cuda_capability(request.device)
    if (major, minor) < (8, 0):
        return f"flash attention needs compute capability 8.0 or newer, this GPU has {major}.{minor}"
    if request.head_dim % 8 or request.head_dim > 256:
        return f"flash attention needs a head size that is a multiple of 8 and at most 256, not {request.head_dim}"
    impl = flash_attention_impl()
    if request.dropout > 0 and impl not in (None, "FA2"):
        return (
            f"{impl} is active for PyTorch's flash kernels and has no dropout (attention_probs_dropout_prob "
            f"{request.dropout})"
        )
    return None


#: name -> :class:`AttentionKernel` (the config's ``attn_implementation``); see the module docstring.
ATTENTION_FUNCTIONS: dict[str, AttentionKernel] = {
    "eager": AttentionKernel(
        eager_attention, "padded", returns_probabilities=True, fallback=None, cross_attention=True, sliding_window=True
    ),
    "sdpa": AttentionKernel(sdpa_attention, "padded", fallback="eager", cross_attention=True, sliding_window=True),
    "varlen": AttentionKernel(
        varlen_attention,
        "unpadded",
        unsupported=flash_varlen_unsupported,
        fallback="sdpa",
        cross_attention=True,
        sliding_window=True,
    ),
}


def register_attention(
    name: str,
    function: AttentionFunction,
    *,
    layout: str = "padded",
    returns_probabilities: bool = False,
    unsupported: Callable[[AttentionRequest], str | None] = _always,
    fallback: str | None = "sdpa",
    cross_attention: bool = False,
    sliding_window: bool = False,
) -> AttentionKernel:
    """Add an attention kernel under ``name`` (usable as ``attn_implementation``), declaring its ``layout``
    (``"unpadded"`` if it reads ``cu_seqlens``), whether it ``returns_probabilities``, when it cannot run
    (``unsupported``), what runs instead (``fallback``), whether it takes ``kv_unpadding`` (``cross_attention``)
    and ``window`` (``sliding_window``); see :class:`AttentionKernel`. Returns the entry.
    Raises ValueError if the name is taken or the layout unknown."""
    if name in ATTENTION_FUNCTIONS:
        raise ValueError(f"attention implementation {name!r} is already registered")
    kernel = AttentionKernel(
        function, layout, returns_probabilities, unsupported, fallback, cross_attention, sliding_window
    )
    ATTENTION_FUNCTIONS[name] = kernel
    return kernel


_explained: set[str] = set()


def _why_not(kernel: AttentionKernel, request: AttentionRequest) -> str | None:
    """Why ``kernel`` cannot run ``request`` (its own :attr:`AttentionKernel.unsupported`, or a sliding window it
    does not take), or None."""
    if request.window is not None and not kernel.sliding_window:
        return f"it takes no sliding window (a local layer's {request.window} positions each side)"
    return kernel.unsupported(request)


def check_attention_name(name: str | None) -> None:
    """Raise ``ValueError`` naming the registered kernels unless ``name`` is one of :data:`ATTENTION_FUNCTIONS`
    or None (the default choice). Models call it when built, so a run refuses a misspelt kernel before it writes."""
    if name is not None and name not in ATTENTION_FUNCTIONS:
        raise ValueError(
            f"attn_implementation={name!r} is not a registered attention kernel; use one of "
            f"{sorted(ATTENTION_FUNCTIONS)} (or None: varlen on CUDA in bf16/fp16, sdpa elsewhere)"
        )


def select_attention(name: str | None, request: AttentionRequest) -> str:
    """The kernel that runs ``request`` for a config's ``attn_implementation`` ``name``.

    None prefers ``varlen`` (flash on unpadded tokens) on CUDA in bf16/fp16 and ``sdpa`` elsewhere. A kernel that
    cannot run the request (:attr:`AttentionKernel.unsupported`) hands it to its fallback (varlen -> sdpa ->
    eager), with one log line (once per process and reason) saying why; ``output_attentions`` takes ``eager``
    unless the kernel returns probabilities. Raises ValueError naming the registered kernels for an unknown
    name."""
    check_attention_name(name)
    chosen = name or ("varlen" if request.device.type == "cuda" and request.dtype in LOW_PRECISION else "sdpa")
    if request.output_attentions and not ATTENTION_FUNCTIONS[chosen].returns_probabilities:
        return "eager"
    tried = set()
    while (reason := _why_not(ATTENTION_FUNCTIONS[chosen], request)) is not None:
        tried.add(chosen)
        fallback = ATTENTION_FUNCTIONS[chosen].fallback or "eager"
        if fallback in tried:
            raise RuntimeError(f"no attention kernel can run this forward: {chosen}: {reason}")
        message = f"attention: {chosen} cannot run here ({reason}); using {fallback}"
        if message not in _explained:
            _explained.add(message)
            logger.warning(message)
        chosen = fallback
    return chosen


__all__ = [
    "ATTENTION_FUNCTIONS",
    "AttentionKernel",
    "AttentionRequest",
    "register_attention",
    "select_attention",
    "check_attention_name",
    "flash_varlen_unsupported",
    "eager_attention",
    "sdpa_attention",
    "varlen_attention",
]
