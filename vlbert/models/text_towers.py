"""Text towers under the region pathway: which text encoder a single-stream vision-language model runs over
[text ; regions], chosen by ``config.text_tower`` through :data:`TEXT_TOWERS` at construction.

| entry | embeddings | encoder | source |
|---|---|---|---|
| ``bert`` | word + position + segment, LN | BERT's post-LN layers | Devlin et al. 2019; UNITER, VisualBERT |
| ``modernbert`` | word, LN (+ a new region modality table) | ModernBERT's pre-LN RoPE layers, all global | Warner et al. 2024 |

A ModernBERT tower (:mod:`vlbert.models.modernbert`, its fields :mod:`vlbert.text_tower_config`) joins the regions
as BERT's does, with three decisions, each the simplest that keeps the tower's text function and BERT's region
contract (DESIGN: regions are an unordered set):

* **Segment.** ModernBERT has no token-type table, and UNITER's region embedding adds one row of the text's
  (``type[1]``) to every region. :class:`ModernBertTextEmbeddings` carries a ``token_type_embeddings`` table
  (``type_vocab_size`` rows, new weights: loading a ModernBERT directory initialises them and says so in the
  loading log line) that only the region pathways read: it is the regions' modality embedding. Text rows are
  ModernBERT's own (word embedding, norm, dropout), unchanged.
* **Positions.** Text tokens are rotated by RoPE at their column, as in ModernBERT; regions are not rotated (one
  position, 0, for all of them: :meth:`ModernBertEncoder.forward <vlbert.models.modernbert.ModernBertEncoder.forward>`
  ``text_length``). A rotation changes a query-key score by the difference of their positions only, so region-region
  scores carry no position and permuting the regions permutes their outputs; a region's position is its box, in
  the region embedding. Positions are read from the unpadded layout's columns on the device, so every attention
  kernel (eager, sdpa, varlen) and the collator's layout see the same rotated q and k.
* **Sliding windows.** Every layer attends globally over [text ; regions] (each keeps its RoPE base). A local
  layer's window runs along the sequence, so it would let a word see only the regions placed near the text's end,
  which makes region order matter and leaves most words without the image in two layers of three. For text no
  longer than ``local_attention // 2 + 1`` tokens (65 in ModernBERT-base; VQA questions and captions are shorter)
  this is exactly the tower's text function; longer text sees past its trained window.

LXMERT's two streams take the BERT tower only (its layers are BERT layers): :meth:`VLBertConfig.check_modernbert_tower
<vlbert.config.VLBertConfig.check_modernbert_tower>` refuses the others in one line.
"""

from __future__ import annotations

import torch
from torch import nn

from vlbert.layers.unpadded import Unpadding
from vlbert.models.bert import BertEmbeddings, BertEncoder
from vlbert.models.modernbert import ModernBertEmbeddings, ModernBertEncoder, modernbert_init
from vlbert.models.outputs import EncoderOutput
from vlbert.modernbert_config import ModernBertConfig


class ModernBertTextEmbeddings(ModernBertEmbeddings):
    """ModernBERT's input embeddings (word, LayerNorm, dropout) plus ``token_type_embeddings`` float
    [type_vocab_size, H], the regions' modality table (read by the region pathways, never added to text).

    Args of forward: input_ids int64 [B, T]; token_type_ids accepted and not read (ModernBERT has no segments).
    Returns float [B, T, H]."""

    def __init__(self, config: ModernBertConfig, type_vocab_size: int):
        super().__init__(config)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, config.hidden_size)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(input_ids)


class ModernBertTowerEncoder(ModernBertEncoder):
    """:class:`~vlbert.models.modernbert.ModernBertEncoder` with every layer global (see the module docstring),
    initialised as ModernBERT (truncated normals, scaled output projections: ``modernbert_init``) rather than as the
    rest of the vision-language model."""

    def __init__(self, config: ModernBertConfig):
        super().__init__(config, windows=False)
        self.text_config = config

    def _init_own_weights(self, std: float) -> None:
        """After the vision-language model's generic initialisation: ModernBERT's own, module by module."""
        for module in self.modules():
            modernbert_init(module, self.text_config)


class BertTower:
    """``text_tower: bert``: BERT's embeddings and post-LN encoder, read from the config's BERT fields."""

    @staticmethod
    def embeddings(config) -> nn.Module:
        return BertEmbeddings(config)

    @staticmethod
    def encoder(config) -> nn.Module:
        return BertEncoder(config)

    @staticmethod
    def encode(
        encoder: nn.Module,
        x: torch.Tensor,
        mask: torch.Tensor,
        hidden: bool,
        attentions: bool,
        unpadding: Unpadding | None,
        text_length: int | None,
    ) -> EncoderOutput:
        """Run ``encoder`` over the embeddings x float [B, S, H] with mask [B, S]; ``text_length`` is not read
        (BERT's positions are in its embeddings)."""
        return encoder(x, mask, hidden, attentions, unpadding)


class ModernBertTower:
    """``text_tower: modernbert``: ModernBERT's embeddings with the regions' modality table, and its encoder with
    every layer global and the regions unrotated (the module docstring says why)."""

    @staticmethod
    def embeddings(config) -> nn.Module:
        return ModernBertTextEmbeddings(config.text_config(), config.type_vocab_size)

    @staticmethod
    def encoder(config) -> nn.Module:
        return ModernBertTowerEncoder(config.text_config())

    @staticmethod
    def encode(
        encoder: nn.Module,
        x: torch.Tensor,
        mask: torch.Tensor,
        hidden: bool,
        attentions: bool,
        unpadding: Unpadding | None,
        text_length: int | None,
    ) -> EncoderOutput:
        """As :meth:`BertTower.encode`; columns from ``text_length`` on (the regions) get no rotation."""
        return encoder(x, mask, hidden, attentions, unpadding, text_length=text_length)


#: config.text_tower -> the text encoder a single-stream vision-language model builds and how it runs it.
TEXT_TOWERS = {"bert": BertTower, "modernbert": ModernBertTower}


__all__ = ["TEXT_TOWERS", "BertTower", "ModernBertTower", "ModernBertTextEmbeddings", "ModernBertTowerEncoder"]
