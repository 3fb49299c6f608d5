"""Classification of an image + text pair from the joint [CLS] (visual entailment, and any task of that shape)."""

from __future__ import annotations

from torch import nn

from vlbert.config import VLBertConfig
from vlbert.models.heads import ClassificationOutput
from vlbert.models.kernels import Dropout
from vlbert.models.losses import classification_loss
from vlbert.models.pretrained import PreTrainedModel
from vlbert.models.vl import VLBertModel


class VLBertForSequenceClassification(PreTrainedModel):
    """Image + text -> one of ``config.num_labels`` classes: dropout and a linear layer on the pooled [CLS] of
    :class:`VLBertModel`, trained with cross-entropy (BERT section 4.1's classification head over the joint
    encoding; UNITER section 4 fine-tunes SNLI-VE this way, as 3-way classification).
    """

    config_class = VLBertConfig
    base_model_prefix = "bert"
    objectives = ("cls",)

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.bert = VLBertModel(config)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, region_features=None, region_boxes=None,
                region_mask=None, labels=None) -> ClassificationOutput:
        """Args: text [B, T] and regions as :meth:`VLBertModel.forward`; labels int64 [B] in [0, num_labels).
        Returns logits float [B, num_labels]; with labels, ``losses["cls"]`` and ``metrics["cls_accuracy"]``.
        Raises: ValueError as :meth:`VLBertModel.forward`."""
        enc = self.bert(input_ids, token_type_ids, attention_mask, region_features, region_boxes, region_mask)
        out = ClassificationOutput(logits=self.classifier(self.dropout(enc.pooler_output)))
        if labels is not None:
            loss, accuracy, n = classification_loss(out.logits, labels)
            out.add("cls", loss, "cls_accuracy", accuracy, n)
        return out


__all__ = ["VLBertForSequenceClassification"]
