"""ModernBERT's text fine-tuning heads: sequence classification (or regression) and token classification.

As transformers' ``ModernBertForSequenceClassification`` / ``ModernBertForTokenClassification``
(``models/modernbert/modeling_modernbert.py`` at v5.24.0): the encoder, the prediction head (dense, activation,
LayerNorm: the MLM head's first half, so a masked-LM checkpoint starts it), dropout ``classifier_dropout``, a
linear classifier. A sequence is pooled from its first token (``classifier_pooling`` "cls") or as the mean over
its real tokens ("mean"). Losses and metrics are BERT's heads' (:mod:`vlbert.models.heads`).
"""

from __future__ import annotations

import torch
from torch import nn

from vlbert.layers.kernels import Dropout
from vlbert.layers.unpadded import Layout
from vlbert.models.heads import ClassificationOutput, add_sequence_loss, add_token_loss
from vlbert.models.modernbert import ModernBertModel, ModernBertPredictionHead, ModernBertPreTrainedModel


def pool(last_hidden_state: torch.Tensor, attention_mask: torch.Tensor | None, how: str) -> torch.Tensor:
    """float [B, T, H] -> [B, H]: the first position (``how`` "cls") or the mean over the positions
    ``attention_mask`` [B, T] marks real ("mean"; all positions without a mask)."""
    if how == "cls":
        return last_hidden_state[:, 0]
    if attention_mask is None:
        return last_hidden_state.mean(1)
    mask = attention_mask.to(last_hidden_state.dtype)[..., None]
    return (last_hidden_state * mask).sum(1) / mask.sum(1)


class _ModernBertTaskModel(ModernBertPreTrainedModel):
    """The encoder, the prediction head, dropout and a classifier of ``outputs`` units (hidden_size^-0.5 init); a
    subclass says which states it classifies (:meth:`states`) and how its labels are scored (:meth:`add_loss`)."""

    def __init__(self, config, outputs: int):
        super().__init__(config)
        self.bert = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.dropout = Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, outputs)
        self.classifier.init_std = config.hidden_size**-0.5  # (read by the initialisation)
        self.init_weights()

    def states(self, last_hidden_state: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The final states the classifier reads, from last_hidden_state float [B, T, H]."""
        raise NotImplementedError

    def add_loss(self, out: ClassificationOutput, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Add the loss and metric of ``labels`` to ``out``."""
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        layout: Layout = None,
    ) -> ClassificationOutput:
        """Args: as :meth:`~vlbert.models.modernbert.ModernBertModel.forward` (``token_type_ids`` not read);
        labels as the subclass's docstring. Returns the subclass's logits, with labels its loss and metric.
        Raises ValueError for a label outside [0, num_labels)."""
        enc = self.bert(
            input_ids,
            attention_mask,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            layout=layout,
        )
        states = self.states(enc.last_hidden_state, attention_mask)
        logits = self.classifier(self.dropout(self.head(states)))
        out = ClassificationOutput(logits=logits, hidden_states=enc.hidden_states, attentions=enc.attentions)
        if labels is not None:
            self.add_loss(out, logits, labels)
        return out


class ModernBertForSequenceClassification(_ModernBertTaskModel):
    """Pooled sequence -> prediction head -> dropout -> linear: classification (int64 labels [B]), regression
    (``num_labels`` 1, float labels [B]) or multi-label (float labels [B, num_labels]), as
    :class:`~vlbert.models.heads.BertForSequenceClassification`'s losses. Logits float [B, num_labels]; with
    labels ``losses["cls"]`` and ``metrics["cls_accuracy"]`` (or ``cls_mse``)."""

    objectives = ("cls",)

    def __init__(self, config):
        super().__init__(config, config.num_labels)

    def states(self, last_hidden_state, attention_mask):
        return pool(last_hidden_state, attention_mask, self.config.classifier_pooling)

    def add_loss(self, out, logits, labels):
        add_sequence_loss(out, logits, labels, self.config.num_labels)


class ModernBertForTokenClassification(_ModernBertTaskModel):
    """Every token's final state -> prediction head -> dropout -> linear (tagging), as
    :class:`~vlbert.models.heads.BertForTokenClassification`'s loss (labels int64 [B, T], -100 unscored). Logits
    float [B, T, num_labels]; with labels ``losses["tag"]`` and ``metrics["tag_accuracy"]``."""

    objectives = ("tag",)

    def __init__(self, config):
        super().__init__(config, config.num_labels)

    def states(self, last_hidden_state, attention_mask):
        return last_hidden_state

    def add_loss(self, out, logits, labels):
        add_token_loss(out, logits, labels, self.config.num_labels)


__all__ = ["ModernBertForSequenceClassification", "ModernBertForTokenClassification", "pool"]
