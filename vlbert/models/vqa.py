"""VQA head on the VL encoder: answers as multi-label classification from the joint [CLS]."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vlbert.config import VLBertConfig
from vlbert.layers.kernels import Dropout
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
            add_vqa_loss(out, logits, answer_targets)
        out.include_idle(*self.bert.idle_modules())
        return out


def add_vqa_loss(out: VQAOutput, logits: torch.Tensor, answer_targets: torch.Tensor) -> None:
    """Soft-score BCE (summed over answers, averaged over questions) and the top answer's soft score, added to
    ``out`` as ``losses["vqa"]`` / ``metrics["vqa_score"]``. logits, answer_targets: float [B, A].
    Raises: ValueError when the shapes differ."""
    if answer_targets.shape != logits.shape:
        raise ValueError(f"answer_targets {tuple(answer_targets.shape)} must be [batch, num_labels="
                         f"{logits.shape[-1]}]")
    scores = upcast(logits)
    targets = answer_targets.to(scores.dtype)
    loss = F.binary_cross_entropy_with_logits(scores, targets, reduction="sum") / logits.shape[0]
    with torch.no_grad():
        score = targets.gather(1, logits.argmax(-1, keepdim=True)).mean()
    out.add("vqa", loss, "vqa_score", score, logits.shape[0])


class VLBertForMaskedTokenVQA(PreTrainedModel):
    """VisualBERT's VQA head: the question is ``[CLS] question [MASK] [SEP]`` and the answer is read from the hidden
    state of the [MASK], the last text token before [SEP] (position ``attention_mask.sum(1) - 2``), through dropout
    and one Linear(H, A) (transformers ``VisualBertForQuestionAnswering``; uclanlp/visualbert, ``configs/vqa``).
    Trained here with the same soft-score BCE as :class:`VLBertForVQA`. The tokenisation must put the [MASK]
    there: pipelines and recipes append ``question_suffix`` to every question.
    """

    config_class = VLBertConfig
    base_model_prefix = "bert"
    objectives = ("vqa",)
    question_suffix = " [MASK]"

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.bert = VLBertModel(config)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, region_features=None, region_boxes=None,
                region_mask=None, answer_targets=None, region_token_type_ids=None) -> VQAOutput:
        """Args: question [B, T] ending ``[MASK] [SEP]`` (right-padded) and regions as :class:`VLBertModel`;
        answer_targets float [B, A]. Returns logits [B, A] (and the loss as :class:`VLBertForVQA`)."""
        enc = self.bert(input_ids, token_type_ids, attention_mask, region_features, region_boxes, region_mask,
                        region_token_type_ids=region_token_type_ids)
        lengths = attention_mask.sum(1) if attention_mask is not None else input_ids.new_full(
            (input_ids.shape[0],), input_ids.shape[1])
        at_mask = enc.last_hidden_state[torch.arange(input_ids.shape[0], device=input_ids.device), lengths - 2]
        out = VQAOutput(logits=self.classifier(self.dropout(at_mask)))
        if answer_targets is not None:
            add_vqa_loss(out, out.logits, answer_targets)
        out.include_idle(*self.bert.idle_modules(), self.bert.pooler)  # the answer is read at the [MASK]
        return out


__all__ = ["VLBertForVQA", "VLBertForMaskedTokenVQA", "VQAOutput", "add_vqa_loss"]
