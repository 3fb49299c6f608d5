"""What a BERT forward checks of its text inputs, and the packed layout a collator hands it.

:func:`check_text_inputs` refuses inputs a model cannot embed with a message naming the fix (values checked on the
host only: on an accelerator a check would stall every step); :func:`packing_from_batch` turns the collator's
``packed_indices`` / ``cu_seqlens`` (:func:`~vlbert.layers.packing.packing_fields`), which a public forward takes in
its ``**packing`` keywords, into the encoder's :class:`~vlbert.layers.packing.Packing`, and :func:`stream_layouts`
a two-stream model's ``text_*`` / ``region_*`` fields into one per stream.
"""

from __future__ import annotations

import torch

from vlbert.config import BertConfig
from vlbert.layers.packing import LAYOUT_KEYS, PACKING_FIELDS, STREAM_PACKING_FIELDS, Packing


def check_text_inputs(
    config: BertConfig,
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
) -> None:
    """Raise ``ValueError`` for text inputs a model of ``config`` cannot embed, naming the input and the fix:
    not [B, T] integer ids, T beyond ``max_position_embeddings``, token_type_ids/attention_mask of another shape,
    ids outside the embedding tables (``vocab_size``, ``type_vocab_size``), or a row with no real token.

    Shapes are always checked; values are checked on CPU tensors. On an accelerator a value check would stall
    the host on every step, so there an out-of-range id becomes an asynchronous device assertion instead.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, seq_len], got shape {tuple(input_ids.shape)}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
    if input_ids.shape[1] > config.max_position_embeddings:
        raise ValueError(
            f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings="
            f"{config.max_position_embeddings}; truncate inputs (e.g. max_seq_length) to at most that"
        )
    for name, t in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask)):
        if t is not None and t.shape != input_ids.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but input_ids has {tuple(input_ids.shape)}")
    if torch.compiler.is_compiling() or input_ids.numel() == 0:
        return
    ranges = [("input_ids", input_ids, config.vocab_size, "the tokenizer saved with the checkpoint")]
    if token_type_ids is not None:
        ranges.append(("token_type_ids", token_type_ids, config.type_vocab_size, "0 (segment A) and 1 (segment B)"))
    for name, ids, size, fix in ranges:
        if ids.device.type != "cpu":
            torch._assert_async(((ids >= 0) & (ids < size)).all(), f"{name} outside [0, {size})")
            continue
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= size:
            raise ValueError(
                f"{name} holds {low if low < 0 else high}, outside the model's table of {size} entries; use {fix}"
            )
    if attention_mask is not None and attention_mask.device.type == "cpu" and not attention_mask.any(1).all():
        row = int((~attention_mask.bool().any(1)).nonzero()[0])
        raise ValueError(f"attention_mask row {row} has no real token (all 0); every sequence needs at least [CLS]")


def take_packing(kwargs: dict) -> dict:
    """Pop the packed-layout fields (:data:`~vlbert.layers.packing.PACKING_FIELDS`: ``packed_indices``,
    ``cu_seqlens`` and a two-stream model's ``text_*`` / ``region_*`` ones) out of a forward's ``**kwargs``;
    returns them (absent ones left out)."""
    return {name: kwargs.pop(name) for name in PACKING_FIELDS if name in kwargs}


def packing_from_batch(
    mask: torch.Tensor | None,
    packed_indices: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    **unknown,
) -> Packing | None:
    """The collator's packed layout (:func:`~vlbert.layers.packing.packing_fields`) of ``mask`` [B, S], or None
    when the batch has none.

    Raises:
        TypeError: a keyword other than the layout's (a misspelt input would otherwise be ignored).
        ValueError: only one of the two fields is given, or they do not fit the mask's shape (shapes only: the
            values are the collator's)."""
    if unknown:
        raise TypeError(
            f"forward got unexpected keyword(s) {sorted(unknown)}; besides its named inputs it takes "
            f"only the packed layout {list(LAYOUT_KEYS)}"
        )
    if packed_indices is None and cu_seqlens is None:
        return None
    if packed_indices is None or cu_seqlens is None or mask is None:
        raise ValueError(
            "packed_indices, cu_seqlens and the attention mask come together (the collator's "
            "packing_fields); pass all three or none"
        )
    if cu_seqlens.shape != (mask.shape[0] + 1,) or packed_indices.dim() != 1:
        raise ValueError(
            f"cu_seqlens {tuple(cu_seqlens.shape)} / packed_indices {tuple(packed_indices.shape)} do "
            f"not describe a mask of {tuple(mask.shape)}; recompute them with packing_fields"
        )
    return Packing.from_indices(packed_indices, cu_seqlens, mask)


def stream_layouts(
    text_mask: torch.Tensor | None, region_mask: torch.Tensor | None, packing: dict
) -> tuple[Packing | None, Packing | None]:
    """A two-stream model's layouts from the collator's fields (:func:`~vlbert.layers.packing.stream_packing_fields`
    in ``packing``): (text layout of ``text_mask`` [B, T], region layout of ``region_mask`` [B, R]), None for a
    stream whose fields the batch lacks. Raises ValueError as :func:`packing_from_batch` for each stream."""
    fields = [
        {key: packing[prefix + key] for key in LAYOUT_KEYS if prefix + key in packing}
        for prefix in ("text_", "region_")
    ]
    return packing_from_batch(text_mask, **fields[0]), packing_from_batch(region_mask, **fields[1])


def refuse_stream_layouts(packing: dict) -> None:
    """Raise ``ValueError`` when ``packing`` holds a two-stream model's per-stream layout
    (:data:`~vlbert.layers.packing.STREAM_PACKING_FIELDS`) for a single-stream model, which packs [text ; regions]
    as one sequence."""
    given = sorted(set(packing) & set(STREAM_PACKING_FIELDS))
    if given:
        raise ValueError(
            f"the batch carries a two-stream model's per-stream layout {given}, but this model is "
            "single-stream: collate with VLCollator(two_stream=False) (packing_fields of "
            "[text ; regions]) or drop those fields"
        )


__all__ = ["check_text_inputs", "packing_from_batch", "take_packing", "stream_layouts", "refuse_stream_layouts"]
