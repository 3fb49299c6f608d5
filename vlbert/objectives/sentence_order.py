"""Sentence-order prediction (``sop``; ALBERT, Lan et al. 2019, section 4.2): a pair is two consecutive segments
of one document; the positive keeps them in order ([CLS] A [SEP] B [SEP], label 0), the negative swaps the same
two ([CLS] B [SEP] A [SEP], label 1), each with probability 1/2. Unlike NSP, both classes share topic and
document, so the head learns discourse order, not topic (google-research/albert ``create_pretraining_data.py``,
``--random_next_sentence`` off). Cross-entropy on the pooled [CLS] through the 2-way head NSP uses
(``next_sentence``: a text checkpoint keeps BERT's keys); labels as transformers' ``AlbertForPreTraining``
(``sentence_order_label``: 0 = in order, 1 = swapped).

The pairs must have B following A (the text recipe then draws no random B); the unit stands before the masking
units in :data:`~vlbert.objectives.OBJECTIVES`, so a swapped pair is masked after the swap.
"""

from __future__ import annotations

import torch

from vlbert.objectives.base import PrepareContext
from vlbert.objectives.next_sentence import NextSentencePrediction

IN_ORDER, SWAPPED = 0, 1


def swap_segments(item: dict) -> dict:
    """The item's pair with its two segments swapped: ``input_ids`` [CLS] B [SEP] A [SEP] and ``token_type_ids``
    0 over [CLS] B [SEP], 1 over A [SEP] (lists of int, the same length as the item's)."""
    ids, types = item["input_ids"], item["token_type_ids"]
    a_end = types.index(1) if 1 in types else len(ids)  # [CLS] A [SEP] are ids[:a_end]
    a, b = ids[1 : a_end - 1], ids[a_end:-1]
    return {
        "input_ids": [ids[0], *b, ids[a_end - 1], *a, ids[-1]],
        "token_type_ids": [0] * (len(b) + 2) + [1] * (len(a) + 1),
    }


class SentenceOrderPrediction(NextSentencePrediction):
    """``sentence_order_label`` int64 [B] (0 = A then B, 1 = swapped); items: CorpusPairsDataset's pairs with
    ``next_sentence_label`` 0 (B follows A)."""

    name, metric, inputs = "sop", "sop_accuracy", ("sentence_order_label",)
    chance = 0.5  # half the pairs are positive

    def build_head(self, config) -> None:
        """None: the unit uses NSP's head, which the model builds for NSP."""
        return None

    def prepare(self, batch: dict, items: list[dict], ctx: PrepareContext) -> None:
        """Swap half of the pairs (each item's own draw) and re-pad the text.

        Raises:
            ValueError: an item whose B does not follow its A (a random next segment: drop ``nsp``)."""
        if any(x.get("next_sentence_label", 0) != 0 for x in items):
            raise ValueError(
                "sop needs pairs whose segment B follows A; drop nsp from data.objectives (the two "
                "objectives choose segment B differently)"
            )
        swapped = [bool(torch.rand(1, generator=ctx.generator(x, self.name)) < 0.5) for x in items]
        batch.update(ctx.text.pad([swap_segments(x) if s else x for x, s in zip(items, swapped, strict=True)]))
        batch["sentence_order_label"] = torch.tensor([SWAPPED if s else IN_ORDER for s in swapped], dtype=torch.long)


__all__ = ["SentenceOrderPrediction", "swap_segments", "IN_ORDER", "SWAPPED"]
