"""The packed token layout: where the real positions of a padded [B, S] batch are (:class:`Packing`), and the batch
fields in which a collator hands that layout to the model, computed on the host (:func:`packing_fields`; one per
stream for a two-stream model, :func:`stream_packing_fields`), so the model never reads a mask on the device.

Source: the "unpadding" of MLPerf BERT and MosaicBERT, as Dao-AILab/flash-attention@3c0d495
``flash_attn/bert_padding.py`` writes it (``unpad_input``: the real positions' indices and ``cu_seqlens``), whose
variable-length kernels take one ``cu_seqlens`` for the queries and one for the keys (a two-stream model's
cross-attention: :func:`~vlbert.layers.attention.varlen_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Packing:
    """Where the real positions of a padded [B, S] batch are.

    Attributes:
        indices: int64 [N], the flat positions (row * S + column) of the real positions in row order, or None when
            every position is real (then N = B * S and packing is a reshape).
        cu_seqlens: int32 [B + 1], cumulative real lengths: row b's tokens are packed rows
            cu_seqlens[b]:cu_seqlens[b + 1].
        max_seqlen: int, an upper bound of the longest row (S: known on the host without reading the mask).
        batch, seq: B and S.
        mask: bool [B, S], True = real (None when every position is real).

    Build it with :meth:`from_mask` (one ``nonzero``: a host sync on an accelerator) or :meth:`from_indices` with
    what the collator computed on the host (no sync; see :func:`packing_fields`).
    """

    indices: torch.Tensor | None
    cu_seqlens: torch.Tensor
    max_seqlen: int
    batch: int
    seq: int
    mask: torch.Tensor | None

    @classmethod
    def from_mask(cls, mask: torch.Tensor | None, batch: int, seq: int, device=None) -> "Packing":
        """From a [B, S] mask (1/True = real; None = all real). Raises ValueError for a mask of another shape."""
        if mask is None:
            return cls.dense(batch, seq, device)
        if mask.shape != (batch, seq):
            raise ValueError(f"the attention mask is {tuple(mask.shape)}, the batch [{batch}, {seq}]")
        mask = mask.bool()
        cu = F.pad(mask.sum(1, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 0))
        return cls(mask.reshape(-1).nonzero().squeeze(1), cu, seq, batch, seq, mask)

    @classmethod
    def from_indices(cls, indices: torch.Tensor, cu_seqlens: torch.Tensor, mask: torch.Tensor) -> "Packing":
        """From :func:`packing_fields`' ``packed_indices`` and ``cu_seqlens`` and the [B, S] mask they describe."""
        batch, seq = mask.shape
        return cls(indices, cu_seqlens.to(torch.int32), seq, batch, seq, mask.bool())

    @classmethod
    def dense(cls, batch: int, seq: int, device=None, mask: torch.Tensor | None = None) -> "Packing":
        """Every position kept: packing is a reshape. With ``mask`` [B, S] the padded kernels still mask its
        padding (the layers then compute padded positions too, as in transformers)."""
        cu = torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int32, device=device)
        return cls(None, cu, seq, batch, seq, None if mask is None else mask.bool())

    def append(self, extra: int) -> "Packing":
        """The layout of the [B, S + ``extra``] batch whose every row gains ``extra`` real positions after its last
        column (VL-BERT's [END] after [text ; regions]), computed on the device from this one: N + B * extra
        packed positions (host-known), each row's old tokens then its new ones, no host synchronisation."""
        b, s, wide = self.batch, self.seq, self.seq + extra
        device = self.cu_seqlens.device
        mask = None if self.mask is None else F.pad(self.mask, (0, extra), value=True)
        if self.indices is None:  # every position kept: a reshape still
            return Packing.dense(b, wide, device, mask)
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
        return Packing(indices, cu, wide, b, wide, mask)

    @property
    def num_tokens(self) -> int:
        """N, the packed length (host-known: the shape of ``indices``)."""
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


#: The batch keys of one sequence's packed layout (:func:`packing_fields`): the [B, S] mask's ``packed_indices`` and
#: ``cu_seqlens``.
LAYOUT_KEYS = ("packed_indices", "cu_seqlens")
#: A two-stream model's layout, one per stream (:func:`stream_packing_fields`): the text's ([B, T] mask) then the
#: regions' ([B, R] mask), each :data:`LAYOUT_KEYS` behind the stream's prefix.
STREAM_PACKING_FIELDS = tuple(f"{stream}_{key}" for stream in ("text", "region") for key in LAYOUT_KEYS)
#: Every batch key of a packed layout: what a model's ``forward`` takes in ``**packing`` (as transformers passes
#: FlashAttention's ``cu_seq_lens`` through ``**kwargs``) and the trainer passes on.
PACKING_FIELDS = LAYOUT_KEYS + STREAM_PACKING_FIELDS


def packing_fields(*masks: torch.Tensor, prefix: str = "") -> dict[str, torch.Tensor]:
    """What the collator adds so that the model packs without reading the mask on the device: the concatenation of
    ``masks`` along the sequence ([B, T] text, then [B, R] regions for a single-stream vision-language batch) gives
    ``packed_indices`` int64 [N] and ``cu_seqlens`` int32 [B + 1] (see :class:`Packing`), their keys behind
    ``prefix``. Host tensors in, host tensors out (computed in the loader workers)."""
    mask = torch.cat([m.bool() for m in masks], 1)
    packing = Packing.from_mask(mask, *mask.shape)
    return {prefix + key: value for key, value in zip(LAYOUT_KEYS, (packing.indices, packing.cu_seqlens))}


def stream_packing_fields(text_mask: torch.Tensor, region_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """:func:`packing_fields` for a two-stream model (LXMERT), which packs each stream by its own mask: the text
    layout of ``text_mask`` [B, T] (``text_packed_indices``, ``text_cu_seqlens``) and the region layout of
    ``region_mask`` [B, R] (``region_packed_indices``, ``region_cu_seqlens``); :data:`STREAM_PACKING_FIELDS`."""
    return {**packing_fields(text_mask, prefix="text_"), **packing_fields(region_mask, prefix="region_")}


__all__ = [
    "Packing",
    "packing_fields",
    "stream_packing_fields",
    "PACKING_FIELDS",
    "LAYOUT_KEYS",
    "STREAM_PACKING_FIELDS",
]
