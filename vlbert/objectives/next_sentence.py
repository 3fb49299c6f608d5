"""Next-sentence prediction (BERT section 3.1, task 2): is segment B the text that follows A (label 0) or a
random segment from another document (label 1)? Cross-entropy on the pooled [CLS]."""

from __future__ import annotations

import torch
from torch import nn

from vlbert.layers.losses import classification_loss
from vlbert.objectives.base import Encoded, Objective, ObjectiveResult, PrepareContext


class NextSentencePrediction(Objective):
    """``next_sentence_label`` int64 [B] (0 = B follows A, 1 = random), from the pair builder."""

    name, metric, head, inputs = "nsp", "nsp_accuracy", "next_sentence", ("next_sentence_label",)
    chance = 0.5  # half the pairs are positive
    modalities, output = ("text",), "seq_relationship_logits"
    reads = ("bert.pooler",)

    def build_head(self, config) -> nn.Linear:
        return nn.Linear(config.hidden_size, 2)

    def prepare(self, batch: dict, items: list[dict], ctx: PrepareContext) -> None:
        """Raises ValueError when the items carry no ``next_sentence_label`` (a corpus of single texts)."""
        if any("next_sentence_label" not in x for x in items):
            raise ValueError(
                "nsp needs sentence pairs with next_sentence_label (CorpusPairsDataset's items); "
                "drop nsp from data.objectives for single texts"
            )
        batch["next_sentence_label"] = torch.tensor([x["next_sentence_label"] for x in items], dtype=torch.long)

    def predict(self, encoded: Encoded) -> torch.Tensor:
        """float [B, 2], the head's logits on the pooled [CLS] (transformers' ``seq_relationship_logits``)."""
        return getattr(encoded.model, self.head)(encoded.pooled)

    def loss(self, encoded: Encoded, labels) -> ObjectiveResult:
        logits = self.predict(encoded)
        loss, accuracy, n = classification_loss(logits, labels[self.inputs[0]])
        return ObjectiveResult(loss, accuracy, n, logits)


__all__ = ["NextSentencePrediction"]
