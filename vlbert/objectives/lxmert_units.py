"""LXMERT's two pretraining objectives that UNITER lacks (Tan and Bansal 2019, section 3.1; airsplay/lxmert@2249f65
``src/pretrain/lxmert_pretrain.py``):

* ``attr``: masked-region attribute classification: at each masked region, the detector's most likely of its
  attribute classes (400 Visual Genome attributes for BUTD), cross-entropy; the companion of ``mrc`` (LXMERT's
  "detected-label classification"), which keeps its own unit;
* ``qa``: image question answering during pretraining: a caption record that is a question with an answer
  trains an answer classifier over the pooled output (cross-entropy against the answer's index,
  ``num_qa_labels`` answers; rows that are not questions carry -100 and count nothing).

LXMERT weighs its visual losses by the detector's confidence and divides them by ``visual_loss_normalizer``
(6.67); here each unit is a plain mean and the weights are the objective mix's (``configs/vl/lxmert.yaml``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vlbert.layers.losses import IGNORE_INDEX, upcast
from vlbert.layers.mlp_head import mlp_head
from vlbert.objectives.base import Encoded, Objective, ObjectiveResult, PrepareContext
from vlbert.objectives.masked_regions import MaskedRegionClassification


class AttributeClassification(MaskedRegionClassification):
    """``masked_regions`` bool [B, R] and ``region_attribute_labels`` int64 [B, R] (the detector's top attribute at
    masked regions, -100 elsewhere; from the regions' ``attribute_probs``). Head ``attr``: dense + activation +
    LayerNorm + Linear(H, num_attribute_classes), as LXMERT's ``obj_predict_head`` with its ``attr`` decoder."""

    name, metric, head, inputs = "attr", "attr_accuracy", "attr", ("masked_regions", "region_attribute_labels")
    probs_key, labels_key, classes_field = "attribute_probs", "region_attribute_labels", "num_attribute_classes"


class PretrainingQuestionAnswering(Objective):
    """``qa_label`` int64 [B]: the answer's index among ``config.num_qa_labels`` for a question record, -100 for
    a caption. Items carry ``answer_label`` (int, or absent for captions). The loss averages over the question
    rows, and its count is theirs (a 0-d tensor), which weighs the ranks under DDP. Head ``qa``: Linear(H, 2H) ->
    GELU -> LayerNorm -> Linear(2H, num_qa_labels) on the pooled [CLS] (LXMERT's ``answer_head``)."""

    name, metric, head, inputs = "qa", "qa_accuracy", "qa", ("qa_label",)
    reads = ("bert.pooler",)

    def build_head(self, config):
        answers = getattr(config, "num_qa_labels", 0)
        return mlp_head(config.hidden_size, 2 * config.hidden_size, answers, config.layer_norm_eps) if answers else None

    def prepare(self, batch: dict, items: list[dict], ctx: PrepareContext) -> None:
        batch["qa_label"] = torch.tensor([int(x.get("answer_label", IGNORE_INDEX)) for x in items], dtype=torch.long)

    def predict(self, encoded: Encoded) -> torch.Tensor:
        """float [B, num_qa_labels], the answer logits of each row."""
        return getattr(encoded.model, self.head)(encoded.pooled)

    def loss(self, encoded: Encoded, labels) -> ObjectiveResult:
        logits = upcast(self.predict(encoded))
        target = labels["qa_label"]
        valid = target != IGNORE_INDEX
        loss = F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="sum") / valid.sum().clamp(min=1)
        with torch.no_grad():
            correct = ((logits.argmax(-1) == target) & valid).sum()
            accuracy = correct / valid.sum().clamp(min=1)
        # the count of question rows stays on the device: reading it would be a host sync per step
        return ObjectiveResult(loss, accuracy, valid.sum(), logits)


__all__ = ["AttributeClassification", "PretrainingQuestionAnswering"]
