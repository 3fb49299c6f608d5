"""UNITER's fine-tuned heads where they differ from ours (ChenRocks/UNITER at 1dbfa62, ``model/ve.py`` and
``model/nlvr2.py``), so that its published SNLI-VE and NLVR2 checkpoints convert and compute what its code computes
(tests/published/test_published_checkpoints.py checks each against a reference forward written from those files).

* SNLI-VE (``UniterForVisualEntailment``): the VQA answer MLP over the 3 labels (:class:`VLBertForVisualEntailment`).
* NLVR2 ``paired`` (``UniterForNlvr2Paired``): the statement encoded with each image, the left image's regions of
  token type 1 and the right's of type 2 (``use_img_type``; a third row of the token-type table), the two pooled
  [CLS] concatenated and classified by one Linear(2H, 2) (:class:`VLBertForNLVR2Paired`).
* NLVR2 ``paired-attn`` (``UniterForNlvr2PairedAttn``, UNITER's default NLVR2 configuration): the same two
  encodings, each sequence attending to the other's (two multi-head attentions), fused with its own states by
  Linear(2H, H) + ReLU, attention-pooled, and the two pooled vectors classified by Linear(2H, 2)
  (:class:`VLBertForNLVR2PairedAttention`).

Parameter names are UNITER's (``vqa_head`` as our VQA head, ``nlvr2_output``, ``attn1``, ``attn2``, ``fc``,
``attn_pool``), so its tensors load without renaming.
"""

from __future__ import annotations

import torch
from torch import nn

from vlbert.config import VLBertConfig
from vlbert.layers.kernels import Dropout
from vlbert.layers.mlp_head import mlp_head
from vlbert.models.vl_classification import VLBertForImagePairClassification, VLBertForSequenceClassification


class VLBertForVisualEntailment(VLBertForSequenceClassification):
    """SNLI-VE with UNITER's head: the pooled [CLS] -> Linear(H, 2H) -> GELU -> LayerNorm -> Linear(2H, 3)
    (``UniterForVisualEntailment`` is ``UniterForVisualQuestionAnswering`` with 3 answers; ``vqa_output`` ->
    ``vqa_head``). Inputs, target (``labels`` int64 [B]) and outputs as :class:`VLBertForSequenceClassification`
    (cross-entropy; UNITER trained it with binary cross-entropy on one-hot targets, which ranks the labels the same
    way at inference). Label order of UNITER's checkpoints: contradiction, entailment, neutral (``VE_IDX2ENT``).
    """

    def build_head(self, config: VLBertConfig) -> None:
        h = config.hidden_size
        self.vqa_head = mlp_head(h, 2 * h, config.num_labels, config.layer_norm_eps)

    def head(self, encoding, inputs) -> torch.Tensor:
        return self.vqa_head(encoding.pooler_output)


class VLBertForNLVR2Paired(VLBertForImagePairClassification):
    """NLVR2 as UNITER's ``paired`` model: the statement encoded with each image (regions [B, 2, R, ...] as
    :class:`VLBertForImagePairClassification`, left first), the left image's regions of token type
    ``config.region_token_type`` (UNITER: 1) and the right's of the next type (2: ``config.type_vocab_size`` must
    be at least ``region_token_type + 2``), the two pooled [CLS] concatenated [B, 2H] -> ``nlvr2_output``
    Linear(2H, num_labels). Target and outputs as :class:`VLBertForSequenceClassification`.

    Raises:
        ValueError: a token-type table without a row for the right image (at construction); regions not [B, 2, ...].
    """

    def build_head(self, config: VLBertConfig) -> None:
        if config.type_vocab_size < config.region_token_type + 2:
            raise ValueError(
                f"{type(self).__name__} types the right image's regions {config.region_token_type + 1}, "
                f"but config.type_vocab_size is {config.type_vocab_size}; set type_vocab_size to "
                f"{config.region_token_type + 2} (UNITER's NLVR2 checkpoints have 3 token types)"
            )
        self.nlvr2_output = nn.Linear(2 * config.hidden_size, config.num_labels)

    def pair_region_types(self) -> tuple[int, int]:
        """UNITER's ``use_img_type``: the left image's regions of ``config.region_token_type``, the right's of the
        next type."""
        return (self.config.region_token_type, self.config.region_token_type + 1)

    def head(self, encoding, inputs) -> torch.Tensor:
        return self.nlvr2_output(encoding.pooler_output.reshape(inputs.input_ids.shape[0], -1))


class AttentionPool(nn.Module):
    """Attention pooling (UNITER ``model/nlvr2.py`` ``AttentionPool``): weights softmax(ReLU(Linear(H, 1)(x)) -
    10000 at padding) over the positions, then the weighted sum. x float [B, S, H], padding bool [B, S] (True =
    padding) -> [B, H]."""

    def __init__(self, hidden_size: int, dropout: float = 0.0):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(hidden_size, 1), nn.ReLU())
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        score = self.fc(x).squeeze(-1) + padding.to(x.dtype) * -1e4
        return (self.dropout(score.softmax(-1)).unsqueeze(1) @ x).squeeze(1)


class VLBertForNLVR2PairedAttention(VLBertForNLVR2Paired):
    """NLVR2 as UNITER's ``paired-attn`` model (its default NLVR2 configuration): both encodings as
    :class:`VLBertForNLVR2Paired`; then each image's sequence [T + R, H] (text and regions, padding masked) attends to
    the other's (``attn1``: left queries right, ``attn2``: right queries left; multi-head attention with
    ``num_attention_heads`` heads), ``fc`` = Linear(2H, H) -> ReLU -> dropout fuses [attended ; own], ``attn_pool``
    (:class:`AttentionPool`) pools each sequence, and ``nlvr2_output`` Linear(2H, num_labels) classifies [left ;
    right]. The pooler is not read. Shapes, target and outputs as :class:`VLBertForNLVR2Paired`.
    """

    reads_pooler = False

    def build_head(self, config: VLBertConfig) -> None:
        super().build_head(config)
        h = config.hidden_size
        self.attn1 = nn.MultiheadAttention(
            h, config.num_attention_heads, config.attention_probs_dropout_prob, batch_first=True
        )
        self.attn2 = nn.MultiheadAttention(
            h, config.num_attention_heads, config.attention_probs_dropout_prob, batch_first=True
        )
        self.fc = nn.Sequential(nn.Linear(2 * h, h), nn.ReLU(), Dropout(config.hidden_dropout_prob))
        self.attn_pool = AttentionPool(h, config.attention_probs_dropout_prob)

    def head(self, encoding, inputs) -> torch.Tensor:
        b, t = inputs.input_ids.shape
        hidden = encoding.last_hidden_state.view(b, 2, -1, encoding.last_hidden_state.shape[-1])
        text = inputs.text_mask
        regions = inputs.region_mask if inputs.region_mask is not None else text.new_ones(b, 2, hidden.shape[2] - t)
        padding = torch.cat([text[:, None].expand(-1, 2, -1), regions], -1) == 0  # [B, 2, T + R]
        left, right = hidden[:, 0], hidden[:, 1]
        l2r, _ = self.attn1(left, right, right, key_padding_mask=padding[:, 1], need_weights=False)
        r2l, _ = self.attn2(right, left, left, key_padding_mask=padding[:, 0], need_weights=False)
        left = self.attn_pool(self.fc(torch.cat([l2r, left], -1)), padding[:, 0])
        right = self.attn_pool(self.fc(torch.cat([r2l, right], -1)), padding[:, 1])
        return self.nlvr2_output(torch.cat([left, right], -1))


__all__ = ["VLBertForVisualEntailment", "VLBertForNLVR2Paired", "VLBertForNLVR2PairedAttention", "AttentionPool"]
