"""Classification from the joint [CLS]: one image + text (visual entailment and tasks of that shape) and two
images + text (NLVR2)."""

from __future__ import annotations

import torch
from torch import nn

from vlbert.config import VLBertConfig
from vlbert.layers.kernels import Dropout
from vlbert.layers.losses import classification_loss
from vlbert.layers.mlp_head import mlp_head
from vlbert.models.heads import ClassificationOutput
from vlbert.models.vl_task import VLBertForTask


class VLBertForSequenceClassification(VLBertForTask):
    """Image + text -> one of ``config.num_labels`` classes: dropout and a linear layer on the pooled [CLS] of
    :class:`VLBertModel`, trained with cross-entropy (BERT section 4.1's classification head over the joint
    encoding; UNITER section 4 fine-tunes SNLI-VE this way, as 3-way classification).

    Target: ``labels`` int64 [B] in [0, num_labels). Returns logits float [B, num_labels]; with labels,
    ``losses["cls"]`` and ``metrics["cls_accuracy"]``.
    """

    objectives = ("cls",)

    def build_head(self, config: VLBertConfig) -> None:
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def head(self, encoding, inputs) -> torch.Tensor:
        return self.classifier(self.dropout(encoding.pooler_output))

    def add_loss(self, out: ClassificationOutput, labels: torch.Tensor) -> None:
        loss, accuracy, n = classification_loss(out.logits, labels)
        out.add("cls", loss, "cls_accuracy", accuracy, n)


class VLBertForImagePairClassification(VLBertForTask):
    """Is a statement true of a pair of images? The statement is encoded with each image; the two pooled [CLS]
    vectors are concatenated and classified by Linear(2H, 2H) -> GELU -> LayerNorm -> Linear(2H, num_labels)
    (UNITER's and LXMERT's NLVR2 setting: UNITER section 4, LXMERT section 5.1).

    Regions: region_features [B, 2, R, D], region_boxes [B, 2, R, 4] (normalised xyxy), region_mask [B, 2, R],
    region_token_type_ids [B, 2, R] (default: every region ``config.region_token_type``), image 0 = left. Target and
    outputs as :class:`VLBertForSequenceClassification`.
    Raises: ValueError if the regions are not [B, 2, ...].
    """

    objectives = ("cls",)
    add_loss = VLBertForSequenceClassification.add_loss

    def build_head(self, config: VLBertConfig) -> None:
        h = config.hidden_size
        self.classifier = mlp_head(2 * h, 2 * h, config.num_labels, config.layer_norm_eps)

    def pair_region_types(self) -> tuple[int, int] | None:
        """Each image's region token type (left, right), or None for the inputs' own (default: every region
        ``config.region_token_type``)."""
        return None

    def encode(self, inputs):
        """Each statement encoded once with each image: [2B, T + R, H] (rows 2i, 2i + 1: statement i with its
        left, right image: :meth:`~vlbert.models.inputs.VLInputs.image_pairs`); the collator's unpadded layout is
        of those 2B rows (:class:`~vlbert.processing.collator.GroundedCollator` with two images per text)."""
        return self.bert(inputs.image_pairs(self.pair_region_types(), joined=False))

    def head(self, encoding, inputs) -> torch.Tensor:
        return self.classifier(encoding.pooler_output.reshape(inputs.input_ids.shape[0], -1))


class VLBertForVisualReasoning(VLBertForSequenceClassification):
    """NLVR2 as VisualBERT does it: the statement and both images' regions in one sequence, the left image's
    regions of region token type 0 and the right's of type 1, classified from the pooled [CLS] by dropout and a
    Linear(H, num_labels) (transformers ``VisualBertForVisualReasoning``; uclanlp/visualbert
    ``nlvr_dataset.py``). Takes the same inputs as :class:`VLBertForImagePairClassification` (region_features
    [B, 2, R, D], ...), or regions already joined [B, R', ...] with ``region_token_type_ids`` [B, R'].
    """

    def encode(self, inputs):
        """Pairs [B, 2, R, ...] joined into one sequence, the left image's regions of token type 0 and the right's
        of type 1 (:meth:`~vlbert.models.inputs.VLInputs.image_pairs`); regions already joined as given."""
        if inputs.region_features is not None and inputs.region_features.dim() == 4:
            inputs = inputs.image_pairs((0, 1), joined=True)
        return self.bert(inputs)


__all__ = ["VLBertForSequenceClassification", "VLBertForImagePairClassification", "VLBertForVisualReasoning"]
