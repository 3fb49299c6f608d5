"""Referring expression comprehension on the VL encoder: one score per region, the highest names the object."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vlbert.config import VLBertConfig
from vlbert.layers.losses import upcast
from vlbert.layers.mlp_head import mlp_head
from vlbert.models.heads import ClassificationOutput
from vlbert.models.pretrained import PreTrainedModel
from vlbert.models.vl import VLBertModel


class VLBertForReferringExpressions(PreTrainedModel):
    """Scores every region's output against the expression: Linear(H, H) -> GELU -> LayerNorm -> Linear(H, 1) on
    each region position of the joint encoding (UNITER section 4, referring expression comprehension), trained
    with cross-entropy over the image's regions (padding excluded).
    """

    config_class = VLBertConfig
    base_model_prefix = "bert"
    objectives = ("re",)

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.bert = VLBertModel(config)
        h = config.hidden_size
        self.region_scorer = mlp_head(h, h, 1, config.layer_norm_eps)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, region_features=None, region_boxes=None,
                region_mask=None, target_region=None) -> ClassificationOutput:
        """Args: expression [B, T] and regions as :meth:`VLBertModel.forward`; target_region int64 [B], the index
        of the referred region. Returns logits float [B, R] (padding regions at the dtype's minimum); with a
        target, ``losses["re"]`` and ``metrics["re_accuracy"]`` (the top region is the target).
        Raises: ValueError as :meth:`VLBertModel.forward`."""
        enc = self.bert(input_ids, token_type_ids, attention_mask, region_features, region_boxes, region_mask)
        scores = upcast(self.region_scorer(enc.last_hidden_state[:, input_ids.shape[1]:]).squeeze(-1))
        if region_mask is not None:
            scores = scores.masked_fill(region_mask == 0, torch.finfo(scores.dtype).min)
        out = ClassificationOutput(logits=scores)
        if target_region is not None:
            loss = F.cross_entropy(scores, target_region)
            with torch.no_grad():
                accuracy = (scores.argmax(-1) == target_region).float().mean()
            out.add("re", loss, "re_accuracy", accuracy, target_region.numel())
        out.include_idle(*self.bert.idle_modules(), self.bert.pooler)  # regions are scored from their own states
        return out


__all__ = ["VLBertForReferringExpressions"]
