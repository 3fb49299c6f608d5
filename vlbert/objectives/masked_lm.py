"""Masked language modelling (BERT section 3.1, task 1; on image-text pairs, UNITER's MLM conditioned on the
regions): 15% of the wordpieces chosen, 80% -> [MASK], 10% random, 10% kept; cross-entropy at chosen positions
through a head tied to the word embeddings."""

from __future__ import annotations

from vlbert.layers.losses import masked_lm_loss
from vlbert.layers.pretraining_heads import MaskedLMHead
from vlbert.objectives.base import Encoded, Objective, ObjectiveResult, PrepareContext


class MaskedLanguageModeling(Objective):
    """``labels`` int64 [B, T]: the original id at masked positions, -100 elsewhere; optionally
    ``masked_lm_positions`` int64 [N], their flat positions (the collator's, so the loss needs no host sync)."""

    name, metric, head, inputs = "mlm", "mlm_accuracy", "masked_lm", ("labels",)
    optional_inputs, modalities, output = ("masked_lm_positions",), ("text", "vl"), "prediction_logits"

    def build_head(self, config) -> MaskedLMHead:
        return MaskedLMHead(config)

    def prepare(self, batch: dict, items: list[dict], ctx: PrepareContext) -> None:
        batch["input_ids"], batch["labels"] = ctx.text.mask_rows(
            batch["input_ids"], [ctx.generator(x, self.name) for x in items], [len(x["input_ids"]) for x in items])

    def predict(self, encoded: Encoded):
        """float [B, T, vocab_size], the MLM logits over every text position (as transformers without labels)."""
        model = encoded.model
        return getattr(model, self.head)(encoded.text, model.bert.embeddings.word_embeddings.weight)

    def loss(self, encoded: Encoded, labels) -> ObjectiveResult:
        model = encoded.model
        loss, logits, accuracy, n = masked_lm_loss(getattr(model, self.head),
                                                   model.bert.embeddings.word_embeddings.weight, encoded.text,
                                                   labels["labels"], labels.get("masked_lm_positions"))
        return ObjectiveResult(loss, accuracy, n, logits)


__all__ = ["MaskedLanguageModeling"]
