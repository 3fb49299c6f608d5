"""Masked language modelling (BERT section 3.1, task 1; on image-text pairs, UNITER's MLM conditioned on the
regions): 15% of the wordpieces chosen, 80% -> [MASK], 10% random, 10% kept; cross-entropy at chosen positions
through a head tied to the word embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vlbert.layers.losses import masked_lm_loss, masked_positions, upcast
from vlbert.layers.pretraining_heads import MaskedLMHead
from vlbert.objectives.base import Encoded, Objective, ObjectiveResult, PrepareContext, item_squares
from vlbert.objectives.momentum import teacher_of


def distillation_loss(logits: torch.Tensor, soft_labels: torch.Tensor) -> torch.Tensor:
    """The mean over the N masked positions of the cross-entropy of float [N, V] ``logits`` against float [N, V]
    ``soft_labels`` (ALBEF's ``loss_distill``: ``models/xbert.py`` ``BertForMaskedLM.forward`` at b9727e4)."""
    return -torch.sum(F.log_softmax(upcast(logits), -1) * soft_labels, -1).mean()


class MaskedLanguageModeling(Objective):
    """``labels`` int64 [B, T]: the original id at masked positions, -100 elsewhere; with a text collator that
    computes the unpadded layout also ``masked_lm_positions`` int64 [N], their flat positions (row * T + column), so
    the loss needs no host sync. The label and position keys are :attr:`inputs` [0] and :attr:`optional_inputs` [0]: a unit that masks
    differently (:class:`~vlbert.objectives.whole_word_masking.WholeWordMasking`) subclasses this one with its own
    keys and :meth:`choose`, and shares the head."""

    name, metric, head, inputs = "mlm", "mlm_accuracy", "masked_lm", ("labels",)
    optional_inputs, modalities, output = ("masked_lm_positions",), ("text", "vl"), "prediction_logits"

    def build_head(self, config) -> MaskedLMHead:
        return MaskedLMHead(config)

    def choose(self, input_ids: torch.Tensor, ctx: PrepareContext, generator: torch.Generator) -> torch.Tensor:
        """bool [1, n]: the positions of one sequence's ids (int64 [1, n]) chosen for prediction (BERT: a uniform
        15% of the maskable wordpieces, the text collator's ``choose``)."""
        return ctx.text.choose(input_ids, generator)

    def prepare(self, batch: dict, items: list[dict], ctx: PrepareContext) -> None:
        labels_key, positions_key = self.inputs[0], self.optional_inputs[0]
        batch["input_ids"], batch[labels_key] = ctx.text.mask_rows(
            batch["input_ids"],
            [ctx.masking_generator(x) for x in items],
            [len(x["input_ids"]) for x in items],
            lambda ids, g: self.choose(ids, ctx, g),
        )
        if ctx.text.lays_out:  # found here, on the host: selecting the rows in the step needs no host sync
            batch[positions_key] = masked_positions(batch[labels_key])

    def predict(self, encoded: Encoded):
        """float [B, T, vocab_size], the MLM logits over every text position (as transformers without labels)."""
        return getattr(encoded.model, self.head)(encoded.text, encoded.word_embeddings)

    def loss(self, encoded: Encoded, labels) -> ObjectiveResult:
        targets, positions = labels[self.inputs[0]], labels.get(self.optional_inputs[0])
        teacher = teacher_of(encoded.model) if encoded.inputs is not None else None
        alpha = teacher.alpha("mlm") if teacher is not None else 0.0
        if alpha and positions is None:
            positions = masked_positions(targets)  # read once for both passes
        loss, logits, accuracy, n = masked_lm_loss(
            getattr(encoded.model, self.head), encoded.word_embeddings, encoded.text, targets, positions
        )
        if alpha and n:
            soft = self.momentum_labels(teacher, encoded, positions)
            loss = (1 - alpha) * loss + alpha * distillation_loss(logits, soft)
        squares = None
        if n and not alpha and not torch.is_grad_enabled():  # held out: each masked wordpiece's loss and hit
            flat = targets.reshape(-1).index_select(
                0, positions if positions is not None else masked_positions(targets)
            )
            tokens = F.cross_entropy(upcast(logits), flat, reduction="none")
            squares = item_squares(tokens, logits.argmax(-1) == flat)
        return ObjectiveResult(loss, accuracy, n, logits, squares=squares)

    @torch.no_grad()
    def momentum_labels(self, teacher, encoded: Encoded, positions: torch.Tensor) -> torch.Tensor:
        """float [N, vocab_size]: the momentum model's softmax at the masked positions (ALBEF's ``soft_labels =
        F.softmax(logits_m)``, its momentum encoder run on the same masked text and image)."""
        t = encoded.inputs.input_ids.shape[1]

        def scores(parts):  # (the momentum model's weights gathered: teacher.run)
            hidden = parts.bert(encoded.inputs).last_hidden_state[:, :t]
            words = parts.bert.embeddings.word_embeddings.weight
            padded = getattr(parts, self.head)(
                hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions), words, padded=True
            )
            return padded[:, : words.shape[0]]

        return upcast(teacher.run(scores)).softmax(-1)


__all__ = ["MaskedLanguageModeling"]
