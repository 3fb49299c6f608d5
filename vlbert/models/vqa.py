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
from vlbert.models.vl_task import VLBertForTask


@dataclass
class VQAOutput(ObjectiveOutput):
    """``logits``: float [B, num_labels], one score per answer of the answer vocabulary."""

    logits: torch.Tensor | None = None


class VLBertForVQA(VLBertForTask):
    """VQA as multi-label classification over an answer vocabulary from the joint [CLS] (UNITER section 4;
    Anderson et al. 2018 section 3.3): pooled output -> Linear(H, 2H) -> GELU -> LayerNorm -> Linear(2H, A).

    Trained with binary cross-entropy against soft scores (min(#annotators / 3, 1) per answer; see
    :func:`vlbert.data.vqa_answers.answer_targets`), summed over answers and averaged over questions, as BUTD.
    ``config.num_labels`` is the answer vocabulary size A. Target: ``answer_targets`` float [B, A] soft scores.
    Returns logits [B, A]; with targets, ``losses["vqa"]`` and ``metrics["vqa_score"]`` (the soft score of the top
    answer, i.e. VQA accuracy before answer normalisation).
    """

    objectives = ("vqa",)
    label_names = ("answer_targets",)
    output_class = VQAOutput

    def build_head(self, config: VLBertConfig) -> None:
        h = config.hidden_size
        self.vqa_head = mlp_head(h, 2 * h, config.num_labels, config.layer_norm_eps)

    def head(self, encoding, inputs) -> torch.Tensor:
        return self.vqa_head(encoding.pooler_output)

    def add_loss(self, out: VQAOutput, answer_targets: torch.Tensor) -> None:
        add_vqa_loss(out, out.logits, answer_targets)


def add_vqa_loss(out: VQAOutput, logits: torch.Tensor, answer_targets: torch.Tensor) -> None:
    """Soft-score BCE (summed over answers, averaged over questions) and the top answer's soft score, added to
    ``out`` as ``losses["vqa"]`` / ``metrics["vqa_score"]``. logits, answer_targets: float [B, A].
    Raises: ValueError when the shapes differ."""
    if answer_targets.shape != logits.shape:
        raise ValueError(f"answer_targets {tuple(answer_targets.shape)} must be [batch, num_labels={logits.shape[-1]}]")
    scores = upcast(logits)
    targets = answer_targets.to(scores.dtype)
    loss = F.binary_cross_entropy_with_logits(scores, targets, reduction="sum") / logits.shape[0]
    with torch.no_grad():
        score = targets.gather(1, logits.argmax(-1, keepdim=True)).mean()
    out.add("vqa", loss, "vqa_score", score, logits.shape[0])


class VLBertForMaskedTokenVQA(VLBertForVQA):
    """VisualBERT's VQA head: the question is ``[CLS] question [MASK] [SEP]`` and the answer is read from the hidden
    state of the [MASK], the last text token before [SEP] (position ``attention_mask.sum(1) - 2``), through dropout
    and one Linear(H, A) (transformers ``VisualBertForQuestionAnswering``; uclanlp/visualbert, ``configs/vqa``).
    Trained with the same soft-score BCE as :class:`VLBertForVQA`, on the same target. The tokenisation must put the
    [MASK] there (questions right-padded): pipelines and recipes append ``question_suffix`` to every question.
    """

    question_suffix = " [MASK]"
    reads_pooler = False  # the answer is read at the [MASK]

    def build_head(self, config: VLBertConfig) -> None:
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def head(self, encoding, inputs) -> torch.Tensor:
        lengths = inputs.text_mask.sum(1)
        rows = torch.arange(lengths.shape[0], device=lengths.device)
        at_mask = encoding.last_hidden_state[rows, lengths - 2]
        return self.classifier(self.dropout(at_mask))


__all__ = ["VLBertForVQA", "VLBertForMaskedTokenVQA", "VQAOutput", "add_vqa_loss"]
