"""The unpadded layout: where the real positions of a padded [B, S] batch are, so the encoder runs on those alone.

Two objects. :class:`UnpaddedLayout` is what a collator computes on the host from the masks (:func:`unpadded_layout`;
for a two-stream model one per stream, :class:`StreamLayouts` from :func:`stream_layouts`) and hands the model as one
batch entry, ``layout``: it moves to the device with the batch like a tensor (``to``, ``pin_memory``,
``record_stream``), so the model never reads a mask on the device. :class:`Unpadding` is what the encoder runs on:
the layout joined to the mask it describes (or read from the mask on the device, one ``nonzero``), with ``unpad`` /
``pad`` between [B, S, ...] and the unpadded real positions [N, ...].

"Unpadded", not "packed": packing in the field means several sequences in one row; here each row stays one sequence
and only its padding is dropped.

Source: the "unpadding" of MLPerf BERT and MosaicBERT, as Dao-AILab/flash-attention@3c0d495
``flash_attn/bert_padding.py`` writes it (``unpad_input``: the real positions' indices and ``cu_seqlens``), whose
variable-length kernels take one ``cu_seqlens`` for the queries and one for the keys (a two-stream model's
cross-attention: :func:`~vlbert.layers.attention.varlen_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F


@dataclass
class Unpadding:
    """Where the real positions of a padded [B, S] batch are.

    Attributes:
        indices: int64 [N], the flat positions (row * S + column) of the real positions in row order, or None when
            every position is real (then N = B * S and unpadding is a reshape).
        cu_seqlens: int32 [B + 1], cumulative real lengths: row b's tokens are the unpadded rows
            cu_seqlens[b]:cu_seqlens[b + 1].
        max_seqlen: int, an upper bound of the longest row (S: known on the host without reading the mask).
        batch, seq: B and S.
        mask: bool [B, S], True = real (None when every position is real).

    Build it with :meth:`from_mask` (one ``nonzero``: a host sync on an accelerator) or from the collator's
    :class:`UnpaddedLayout` (:meth:`UnpaddedLayout.unpadding`: no sync).
    """

    indices: torch.Tensor | None
    cu_seqlens: torch.Tensor
    max_seqlen: int
    batch: int
    seq: int
    mask: torch.Tensor | None

    @classmethod
    def from_mask(cls, mask: torch.Tensor | None, batch: int, seq: int, device=None) -> "Unpadding":
        """From a [B, S] mask (1/True = real; None = all real). Raises ValueError for a mask of another shape."""
        if mask is None:
            return cls.dense(batch, seq, device)
        if mask.shape != (batch, seq):
            raise ValueError(f"the attention mask is {tuple(mask.shape)}, the batch [{batch}, {seq}]")
        mask = mask.bool()
        cu = F.pad(mask.sum(1, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 0))
        return cls(mask.reshape(-1).nonzero().squeeze(1), cu, seq, batch, seq, mask)

    @classmethod
    def from_indices(cls, indices: torch.Tensor, cu_seqlens: torch.Tensor, mask: torch.Tensor) -> "Unpadding":
        """From the collator's ``indices`` and ``cu_seqlens`` (:class:`UnpaddedLayout`) and the [B, S] mask they
        describe."""
        batch, seq = mask.shape
        return cls(indices, cu_seqlens.to(torch.int32), seq, batch, seq, mask.bool())

    @classmethod
    def dense(cls, batch: int, seq: int, device=None, mask: torch.Tensor | None = None) -> "Unpadding":
        """Every position kept: unpadding is a reshape. With ``mask`` [B, S] the padded kernels still mask its
        padding (the layers then compute padded positions too, as in transformers)."""
        cu = torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int32, device=device)
        return cls(None, cu, seq, batch, seq, None if mask is None else mask.bool())

    def append(self, extra: int) -> "Unpadding":
        """The layout of the [B, S + ``extra``] batch whose every row gains ``extra`` real positions after its last
        column (VL-BERT's [END] after [text ; regions]), computed on the device from this one: N + B * extra
        unpadded positions (host-known), each row's old tokens then its new ones, no host synchronisation."""
        b, s, wide = self.batch, self.seq, self.seq + extra
        device = self.cu_seqlens.device
        mask = None if self.mask is None else F.pad(self.mask, (0, extra), value=True)
        if self.indices is None:  # every position kept: a reshape still
            return Unpadding.dense(b, wide, device, mask)
        rows = torch.arange(b + 1, device=device, dtype=torch.int32)
        cu = self.cu_seqlens.to(torch.int32) + extra * rows
        n = self.indices.numel()
        row_of = torch.div(self.indices, s, rounding_mode="floor")
        indices = torch.empty(n + b * extra, dtype=torch.int64, device=device)
        # old token k of row r moves r * extra slots on (the rows before it gained that many), to column (k % s)
        indices.index_copy_(0, torch.arange(n, device=device) + row_of * extra, self.indices + row_of * extra)
        new = torch.arange(extra, device=device)
        slots = cu[1:].long()[:, None] - extra + new  # [B, extra]: the last slots of each row
        indices.index_copy_(0, slots.reshape(-1), (rows[:-1].long()[:, None] * wide + s + new).reshape(-1))
        return Unpadding(indices, cu, wide, b, wide, mask)

    @property
    def num_tokens(self) -> int:
        """N, the unpadded length (host-known: the shape of ``indices``)."""
        return self.batch * self.seq if self.indices is None else self.indices.numel()

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """[B, S, ...] -> [N, ...]: the real positions in row order."""
        flat = x.reshape(self.batch * self.seq, *x.shape[2:])
        return flat if self.indices is None else flat.index_select(0, self.indices)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """[N, ...] -> [B, S, ...] with zeros at padding."""
        if self.indices is None:
            return x.reshape(self.batch, self.seq, *x.shape[1:])
        out = x.new_zeros(self.batch * self.seq, *x.shape[1:])
        return out.index_copy(0, self.indices, x).view(self.batch, self.seq, *x.shape[1:])

    def key_mask(self) -> torch.Tensor | None:
        """bool [B, 1, 1, S] for a padded attention (True = attend), or None when nothing is padding."""
        return None if self.mask is None else self.mask[:, None, None, :]


class _TensorFields:
    """What the batch's tensors do on their way to the device, applied to every tensor field of a dataclass: the
    loader's ``pin_memory`` (torch's ``pin_memory`` calls it), ``to(device, non_blocking=...)``, and
    ``record_stream`` (the trainer's prefetch on a side stream). Returns new objects; nothing in place."""

    def _map(self, fn):
        return type(self)(**{f.name: fn(getattr(self, f.name)) for f in fields(self)})

    def to(self, device, non_blocking: bool = False):
        """The same layout with its tensors on ``device`` (``Tensor.to``; ``non_blocking`` from pinned memory)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self):
        """The same layout in page-locked host memory (the loader's ``pin_memory=True``)."""
        return self._map(lambda t: t.pin_memory())

    def record_stream(self, stream) -> None:
        """``Tensor.record_stream`` of every tensor: they were copied on a side stream and are used on ``stream``."""
        self._map(lambda t: t.record_stream(stream))


@dataclass
class UnpaddedLayout(_TensorFields):
    """The collator's unpadded layout of one [B, S] mask (the concatenation of a batch's masks along the sequence:
    [B, T] text then [B, R] regions for a single-stream vision-language batch), computed on the host by
    :func:`unpadded_layout`; FlashAttention's ``unpad_input`` (``indices``, ``cu_seqlens``), as transformers passes
    ``cu_seq_lens`` to its flash kernels.

    Attributes:
        indices: int64 [N], the flat positions (row * S + column) of the real positions, in row order.
        cu_seqlens: int32 [B + 1], cumulative real lengths: row b's tokens are the unpadded rows
            cu_seqlens[b]:cu_seqlens[b + 1].
    It moves with the batch (``to``, ``pin_memory``, ``record_stream``) and pickles (loader workers).
    """

    indices: torch.Tensor
    cu_seqlens: torch.Tensor

    def unpadding(self, mask: torch.Tensor) -> Unpadding:
        """The encoder's :class:`Unpadding` of ``mask`` [B, S] (1 = real), which this layout describes (no host sync).

        Raises:
            ValueError: the layout does not fit the mask's shape (shapes only: the values are the collator's)."""
        if mask is None or self.cu_seqlens.shape != (mask.shape[0] + 1,) or self.indices.dim() != 1:
            raise ValueError(
                f"the batch's layout (cu_seqlens {tuple(self.cu_seqlens.shape)}, indices {tuple(self.indices.shape)}) "
                f"does not describe a mask of {None if mask is None else tuple(mask.shape)}; recompute it with "
                "unpadded_layout of the masks the model reads"
            )
        return Unpadding.from_indices(self.indices, self.cu_seqlens, mask)


@dataclass
class StreamLayouts(_TensorFields):
    """A two-stream model's layouts (LXMERT), one per stream, each of its own mask: ``text`` of the [B, T] attention
    mask, ``regions`` of the [B, R] region mask (:func:`stream_layouts`). Moves with the batch as
    :class:`UnpaddedLayout`."""

    text: UnpaddedLayout
    regions: UnpaddedLayout


#: What a model's ``forward`` takes as ``layout``: one sequence's layout, a two-stream model's, or None (the encoder
#: reads the mask on the device).
Layout = UnpaddedLayout | StreamLayouts | None


def unpadded_layout(*masks: torch.Tensor) -> UnpaddedLayout:
    """The layout a collator adds to a batch (key ``layout``) so that the model unpads without reading the mask on the
    device: of the concatenation of ``masks`` along the sequence ([B, T] text, then [B, R] regions for a
    single-stream vision-language batch; 1 = real). Host tensors in, host tensors out (the loader workers compute
    it). Raises ValueError for masks of different batch sizes."""
    if len({m.shape[0] for m in masks}) != 1:
        raise ValueError(f"the masks have batch sizes {[m.shape[0] for m in masks]}; give masks of one batch")
    mask = torch.cat([m.bool() for m in masks], 1)
    unpadding = Unpadding.from_mask(mask, *mask.shape)
    return UnpaddedLayout(unpadding.indices, unpadding.cu_seqlens)


def regions_alone_layout(region_mask: torch.Tensor) -> UnpaddedLayout:
    """:func:`unpadded_layout` of an image's unimodal pass, ``[CLS] [SEP]`` + its regions ([B, 2 + R]), from
    ``region_mask`` [B, R]: what a collator hands the model for retrieval's and ITC's image pass."""
    cls_sep = torch.ones(region_mask.shape[0], 2, dtype=region_mask.dtype)
    return unpadded_layout(cls_sep, region_mask)


def stream_layouts(text_mask: torch.Tensor, region_mask: torch.Tensor) -> StreamLayouts:
    """:func:`unpadded_layout` for a two-stream model (LXMERT), which unpads each stream by its own mask: the text
    layout of ``text_mask`` [B, T] and the region layout of ``region_mask`` [B, R]."""
    return StreamLayouts(unpadded_layout(text_mask), unpadded_layout(region_mask))


#: The batch keys the layout's two tensors had before it was one argument (issue 51): ``packed_indices`` (the
#: ``indices``) and ``cu_seqlens``. Still read from a pretraining model's keywords and still written by
#: ``MaskingCollator(packed=True)``, for one caller: ../shared/gpu/roofline.py (the H100 step proxy every
#: performance figure in docs/performance.md quotes), which builds its batch that way and which this repository
#: cannot change. Remove with that caller's update.
LEGACY_KEYS = ("packed_indices", "cu_seqlens")


def legacy_fields(*masks: torch.Tensor) -> dict[str, torch.Tensor]:
    """:func:`unpadded_layout` under the legacy batch keys (:data:`LEGACY_KEYS`)."""
    layout = unpadded_layout(*masks)
    return dict(zip(LEGACY_KEYS, (layout.indices, layout.cu_seqlens), strict=True))


def pop_legacy_layout(layout: Layout, keywords: dict) -> Layout:
    """``layout``, or the :class:`UnpaddedLayout` of the :data:`LEGACY_KEYS` taken out of ``keywords`` (a
    pretraining forward's label keywords) where a caller passed those instead.

    Raises:
        ValueError: only one of the two keys, or both those and ``layout``."""
    given = [k for k in LEGACY_KEYS if k in keywords]
    if not given:
        return layout
    if len(given) != 2 or layout is not None:
        raise ValueError(
            f"the batch carries {given} and layout={type(layout).__name__}: pass the layout as one argument, "
            "layout=unpadded_layout(mask) (vlbert.layers.unpadded)"
        )
    return UnpaddedLayout(keywords.pop(LEGACY_KEYS[0]), keywords.pop(LEGACY_KEYS[1]))


def unpadding(layout: Layout, mask: torch.Tensor | None) -> Unpadding | None:
    """The encoder's :class:`Unpadding` of ``mask`` from a single-stream model's ``layout``, or None without one (the
    encoder then reads the mask).

    Raises:
        ValueError: ``layout`` is a two-stream model's :class:`StreamLayouts` (the fix named), or does not fit
            ``mask`` (:meth:`UnpaddedLayout.unpadding`)."""
    if layout is None:
        return None
    if isinstance(layout, StreamLayouts):
        raise ValueError(
            "the batch carries a two-stream model's per-stream layouts (StreamLayouts), but this model is "
            "single-stream: collate with VLCollator(two_stream=False) (unpadded_layout of [text ; regions])"
        )
    return layout.unpadding(mask)


__all__ = [
    "Unpadding",
    "UnpaddedLayout",
    "StreamLayouts",
    "Layout",
    "unpadded_layout",
    "stream_layouts",
    "regions_alone_layout",
    "unpadding",
    "LEGACY_KEYS",
    "legacy_fields",
    "pop_legacy_layout",
]
