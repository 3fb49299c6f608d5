"""Heads of the pretraining objectives: the masked-LM head (tied to the word embeddings) and the masked-region
heads (feature regression, classification). Built by the objective units in :mod:`vlbert.objectives`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from vlbert.layers.activations import activation

if TYPE_CHECKING:
    from vlbert.config import BertConfig, VLBertConfig


class MaskedLMHead(nn.Module):
    """MLM head: dense + activation + LayerNorm, then a projection tied to the word embeddings plus a bias.

    Source: BERT appendix A.1; transformers ``BertLMPredictionHead``. The decoder weight is not a parameter of
    this module: it is the word embedding matrix, passed to :meth:`forward`.

    ``forward(..., padded=True)`` computes the projection over ``vocab_size`` rounded up to a multiple of
    :attr:`vocab_multiple` (64, as MosaicBERT pads its vocabulary): the extra rows of the (copied) decoder are
    zero and their bias -inf, so the extra logits are -inf and a softmax gives them nothing. A matrix of 30,522
    rows has rows that are not 16-byte aligned in bf16, which cuBLAS multiplies at a fraction of its peak; the
    copy costs one [V, H] write per step. Only on the devices in :attr:`pad_vocab_on` (CUDA: a CPU gains nothing
    from the alignment and would hold the copy). Checkpoints and parameters keep ``vocab_size``.
    """

    vocab_multiple = 64
    pad_vocab_on = ("cuda",)

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor, padded: bool = False) -> torch.Tensor:
        """Args: hidden float [..., H]; word_embeddings float [V, H]; padded: return the logits over the padded
        vocabulary (see the class docstring; entries V.. are -inf). Returns logits float [..., V] (or
        [..., V rounded up to ``vocab_multiple``])."""
        h = self.norm(self.act(self.dense(hidden)))
        extra = -word_embeddings.shape[0] % self.vocab_multiple
        if not padded or not extra or word_embeddings.device.type not in self.pad_vocab_on:
            return F.linear(h, word_embeddings, self.bias)
        return F.linear(h, F.pad(word_embeddings, (0, 0, 0, extra)), F.pad(self.bias, (0, extra), value=-torch.inf))


class RegionHead(nn.Module):
    """dense + activation + LayerNorm + linear to ``out_dim``: the MRFR (features) and MRC (classes) heads (UNITER
    ``model/pretrain.py``). Without ``config.region_head_norm`` there is no LayerNorm (VL-BERT's ``mvrc_head``,
    jackroos/VL-BERT@4373674 ``common/visual_linguistic_bert.py``)."""

    def __init__(self, config: VLBertConfig, out_dim: int):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.norm = (
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
            if getattr(config, "region_head_norm", True)
            else nn.Identity()
        )
        self.decoder = nn.Linear(config.hidden_size, out_dim)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Args: float [N, H]. Returns float [N, out_dim]."""
        return self.decoder(self.norm(self.act(self.dense(hidden))))


__all__ = ["MaskedLMHead", "RegionHead"]
