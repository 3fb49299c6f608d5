"""Referring expression comprehension on the VL encoder: one score per region, the highest names the object."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vlbert.config import VLBertConfig
from vlbert.layers.losses import upcast
from vlbert.layers.mlp_head import mlp_head
from vlbert.models.heads import ClassificationOutput
from vlbert.models.vl_task import VLBertForTask


class VLBertForReferringExpressions(VLBertForTask):
    """Scores every region's output against the expression: Linear(H, H) -> GELU -> LayerNorm -> Linear(H, 1) on
    each region position of the joint encoding (UNITER section 4, referring expression comprehension), trained
    with cross-entropy over the image's regions (padding excluded).

    Target: ``target_region`` int64 [B], the index of the referred region. Returns logits float [B, R] (padding
    regions at the dtype's minimum); with a target, ``losses["re"]`` and ``metrics["re_accuracy"]`` (the top
    region is the target).
    """

    objectives = ("re",)
    label_names = ("target_region",)
    reads_pooler = False  # regions are scored from their own states

    def build_head(self, config: VLBertConfig) -> None:
        h = config.hidden_size
        self.region_scorer = mlp_head(h, h, 1, config.layer_norm_eps)

    def head(self, encoding, inputs) -> torch.Tensor:
        t = inputs.input_ids.shape[1]
        scores = upcast(self.region_scorer(encoding.last_hidden_state[:, t:]).squeeze(-1))
        if inputs.region_mask is not None:
            scores = scores.masked_fill(inputs.region_mask == 0, torch.finfo(scores.dtype).min)
        return scores

    def add_loss(self, out: ClassificationOutput, target_region: torch.Tensor) -> None:
        loss = F.cross_entropy(out.logits, target_region)
        with torch.no_grad():
            accuracy = (out.logits.argmax(-1) == target_region).float().mean()
        out.add("re", loss, "re_accuracy", accuracy, target_region.numel())


__all__ = ["VLBertForReferringExpressions"]
