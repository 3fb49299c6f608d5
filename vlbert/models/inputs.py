"""What a BERT forward checks of its text inputs: :func:`check_text_inputs` refuses inputs a model cannot embed with a
message naming the fix (values checked on the host only: on an accelerator a check would stall every step). The
collator's unpadded layout is checked where the encoder reads it (:meth:`~vlbert.layers.unpadded.UnpaddedLayout.
unpadding`)."""

from __future__ import annotations

import torch

from vlbert.config import BertConfig


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


__all__ = ["check_text_inputs"]
