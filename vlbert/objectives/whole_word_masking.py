"""Whole-word masking (``wwm``): masked LM where the wordpieces of a word are chosen together, never one piece
of a word alone (google-research/bert's whole-word-masking release of 2019-05-31, ``create_pretraining_data.py``
``--do_whole_word_mask``; transformers' ``DataCollatorForWholeWordMask``). A word is a piece that does not start
with ``##`` (or follows a special token) and the ``##`` pieces that follow it. Words are taken in a random order while the chosen pieces stay
within round(15% x maskable pieces) (at least one word); each chosen piece then gets BERT's 80/10/10 on its own,
as the reference does. The loss, head and metric are masked LM's (the head is shared: ``masked_lm``).
"""

from __future__ import annotations

import torch

from vlbert.objectives.base import PrepareContext
from vlbert.objectives.masked_lm import MaskedLanguageModeling


class WholeWordMasking(MaskedLanguageModeling):
    """``wwm_labels`` int64 [B, T] (the original id at chosen pieces, -100 elsewhere) and, with the unpadded layout,
    ``wwm_positions`` int64 [N]; text models only. Needs the collator's ``word_continuation`` table
    (:meth:`~vlbert.data.pretraining.MaskingCollator.from_tokenizer`)."""

    name, metric, inputs, optional_inputs = "wwm", "wwm_accuracy", ("wwm_labels",), ("wwm_positions",)
    modalities = ("text",)

    def build_head(self, config) -> None:
        """None: the unit uses MLM's head, which the model builds for MLM."""
        return None

    def choose(self, input_ids: torch.Tensor, ctx: PrepareContext, generator: torch.Generator) -> torch.Tensor:
        """bool [1, n]: whole words of one sequence (int64 [1, n]) chosen together (module docstring).

        Raises:
            ValueError: the collator has no ``word_continuation`` table."""
        table = ctx.text.word_continuation
        if table is None:
            raise ValueError(
                "wwm needs the collator's word_continuation table; build the collator with "
                "MaskingCollator.from_tokenizer(tokenizer)"
            )
        maskable = ctx.text.maskable(input_ids)[0]
        after_special = torch.cat([maskable.new_ones(1), ~maskable[:-1]])  # a segment cut mid-word starts one
        starts = maskable & (~table[input_ids[0]] | after_special)
        word = torch.cumsum(starts.long(), 0) - 1  # each piece's word (continuations follow their start)
        chosen = torch.zeros_like(maskable)
        n_words = int(starts.sum())
        if n_words == 0:
            return chosen[None]
        pieces = torch.bincount(word[maskable], minlength=n_words)
        budget = max(1, round(int(maskable.sum()) * ctx.text.mlm_probability))
        order = torch.randperm(n_words, generator=generator)
        fits = torch.cumsum(pieces[order], 0) <= budget
        fits[0] = True  # at least one word, even one longer than the budget
        taken = torch.zeros(n_words, dtype=torch.bool)
        taken[order[fits]] = True
        return (maskable & taken[word.clamp(min=0)])[None]


__all__ = ["WholeWordMasking"]
