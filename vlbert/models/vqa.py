"""VQA head on the VL encoder: answers as multi-label classification from the joint [CLS]."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vlbert.config import VLBertConfig
from vlbert.layers.losses import upcast
from vlbert.layers.mlp_head import mlp_head
from vlbert.models.outputs import ObjectiveOutput
from vlbert.models.pretrained import PreTrainedModel
from vlbert.models.vl import VLBertModel


@dataclass
class VQAOutput(ObjectiveOutput):
    """``logits``: float [B, num_labels], one score per answer of the answer vocabulary."""

    logits: torch.Tensor | None = None


class VLBertForVQA(PreTrainedModel):
    """VQA as multi-label classification over an answer vocabulary from the joint [CLS] (UNITER section 4;
    Anderson et al. 2018 section 3.3): pooled output -> Linear(H, 2H) -> GELU -> LayerNorm -> Linear(2H, A).

    Trained with binary cross-entropy against soft scores (min(#annotators / 3, 1) per answer; see
    :func:`vlbert.data.vqa_answers.answer_targets`), summed over answers and averaged over questions, as BUTD.
    ``config.num_labels`` is the answer vocabulary size A.
    """

    config_class = VLBertConfig
    base_model_prefix = "bert"
    objectives = ("vqa",)

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.bert = VLBertModel(config)
        h = config.hidden_size
        self.vqa_head = mlp_head(h, 2 * h, config.num_labels, config.layer_norm_eps)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, region_features=None, region_boxes=None,
                region_mask=None, answer_targets=None) -> VQAOutput:
        """Args: question [B, T] and regions as :class:`VLBertModel`; answer_targets float [B, A] soft scores.
        Returns logits [B, A]; with targets, ``losses["vqa"]`` and ``metrics["vqa_score"]`` (the soft score of
        the top answer, i.e. VQA accuracy before answer normalisation)."""
        enc = self.bert(input_ids, token_type_ids, attention_mask, region_features, region_boxes, region_mask)
        logits = self.vqa_head(enc.pooler_output)
        out = VQAOutput(logits=logits)
        if answer_targets is not None:
            if answer_targets.shape != logits.shape:
                raise ValueError(f"answer_targets {tuple(answer_targets.shape)} must be [batch, num_labels="
                                 f"{self.config.num_labels}]")
            scores = upcast(logits)
            targets = answer_targets.to(scores.dtype)
            loss = F.binary_cross_entropy_with_logits(scores, targets, reduction="sum") / logits.shape[0]
            with torch.no_grad():
                score = targets.gather(1, logits.argmax(-1, keepdim=True)).mean()
            out.add("vqa", loss, "vqa_score", score, logits.shape[0])
        return out


__all__ = ["VLBertForVQA", "VQAOutput"]
