"""Region pathways: how a detector region (RoI feature + box) becomes one input vector of the single-stream
encoder. One class per published family, chosen by ``config.region_embedding`` through
:data:`REGION_EMBEDDINGS`; adding one is a class here (or in its own module) and one line in the table.

Every entry takes the same inputs and returns the same shape::

    forward(region_features [B, R, D] float (float16 accepted), region_boxes [B, R, 4] float (x1, y1, x2, y2)
            normalised to [0, 1] by image width/height, region_token_type_ids [B, R] int64,
            text: BertEmbeddings (its token-type table and LayerNorm, which some families share),
            masked_regions [B, R] bool or None) -> float [B, R, H]

| entry | equation | source |
|---|---|---|
| ``uniter`` | LN(LN(W_f f) + LN(W_l loc7) + type[t]) | UNITER ``model/model.py`` ``UniterImageEmbeddings`` |
| ``visualbert`` | LN_text(W_f f + pos_v[0] + type_v[t]) | transformers ``VisualBertEmbeddings`` |
| ``oscar`` | W [f ; box6] + b | Oscar ``BertImgModel`` (``use_img_layernorm`` 0) |
| ``vinvl`` | LN(W [f ; box6] + b) | Oscar ``BertImgModel`` (``use_img_layernorm`` 1, VinVL) |
| ``lxmert`` | (LN(W_f f) + LN(W_b box4)) / 2 | airsplay/lxmert ``src/lxrt/modeling.py`` ``VisualFeatEncoder`` |

(dropout after each, as the sources.) ``loc7`` = [x1, y1, x2, y2, w, h, w*h], ``box6`` = [x1, y1, x2, y2, w, h]
(:func:`region_location_features`), ``box4`` = [x1, y1, x2, y2]; ``type`` is row ``t`` of the text's token-type table for UNITER (default
1), of VisualBERT's own visual token-type table (published VQA/COCO checkpoints were trained with 0). Oscar and
VinVL have no type or position term.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from vlbert.layers.kernels import Dropout

if TYPE_CHECKING:
    from vlbert.config import VLBertConfig
    from vlbert.models.bert import BertEmbeddings


def region_location_features(boxes: torch.Tensor, size: int = 7) -> torch.Tensor:
    """The location feature of each region (UNITER section 3.1; Oscar's 6-d box).

    Args:
        boxes: float [..., 4] = (x1, y1, x2, y2), normalised to [0, 1] by image width and height.
        size: 7 -> (x1, y1, x2, y2, w, h, w * h) (UNITER: ``data/data.py`` appends w*h to the 6-d ``norm_bb``);
            6 -> (x1, y1, x2, y2, w, h) (Oscar / VinVL features, UNITER's stored ``norm_bb``).
    Returns:
        float [..., size] with w = x2 - x1, h = y2 - y1 (w * h is the area fraction).
    Raises:
        ValueError: ``size`` is neither 6 nor 7.
    """
    if size not in (6, 7):
        raise ValueError(f"a location feature has 6 or 7 entries, not {size}")
    x1, y1, x2, y2 = boxes.unbind(-1)
    w, h = x2 - x1, y2 - y1
    parts = [x1, y1, x2, y2, w, h] + ([w * h] if size == 7 else [])
    return torch.stack(parts, dim=-1)


class RegionEmbedding(nn.Module):
    """Base class of the table's entries. ``location_dim``: the size of the box feature the entry reads (0 = no
    box input); ``type_vocab``: where the region token type comes from ("text" table, own "visual" table, or
    None); ``default_token_type``: the region type when the inputs give none."""

    location_dim: int = 0

    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.default_token_type = config.region_token_type
        self.dropout = Dropout(config.hidden_dropout_prob)

    @classmethod
    def check_config(cls, config: VLBertConfig) -> None:
        """Raise ``ValueError`` when ``config`` does not fit this pathway (location size, token type)."""
        if config.region_location_dim != cls.location_dim:
            raise ValueError(f"region_embedding={config.region_embedding!r} reads a {cls.location_dim}-d location "
                             f"feature, but config.region_location_dim is {config.region_location_dim}; set it "
                             f"to {cls.location_dim}")

    def forward(self, region_features: torch.Tensor, region_boxes: torch.Tensor,
                region_token_type_ids: torch.Tensor | None, text: BertEmbeddings,
                masked_regions: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError


class UniterRegionEmbeddings(RegionEmbedding):
    """UNITER: LN(LN(W_f f) + LN(W_l loc7) + type[t]), then dropout; ``type`` is the text's token-type table
    (row 1 by default). In masked region modelling ``mask_embedding[1]`` is added to the (zeroed) feature of each
    masked region, row 0 (unmasked) being zero (UNITER ``UniterImageEmbeddings.forward``)."""

    location_dim = 7

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        h, eps = config.hidden_size, config.layer_norm_eps
        self.feature_proj = nn.Linear(config.region_feature_dim, h)
        self.feature_norm = nn.LayerNorm(h, eps=eps)
        self.location_proj = nn.Linear(7, h)
        self.location_norm = nn.LayerNorm(h, eps=eps)
        self.norm = nn.LayerNorm(h, eps=eps)
        self.mask_embedding = nn.Embedding(2, config.region_feature_dim, padding_idx=0)

    def forward(self, region_features, region_boxes, region_token_type_ids, text, masked_regions=None):
        dtype = self.feature_proj.weight.dtype
        f = region_features.to(dtype)
        if masked_regions is not None:
            f = f + self.mask_embedding(masked_regions.long())
        x = self.feature_norm(self.feature_proj(f))
        x = x + self.location_norm(self.location_proj(region_location_features(region_boxes.to(dtype), 7)))
        if region_token_type_ids is None:
            x = x + text.token_type_embeddings.weight[self.default_token_type]
        else:
            x = x + text.token_type_embeddings(region_token_type_ids)
        return self.dropout(self.norm(x))


class VisualBertRegionEmbeddings(RegionEmbedding):
    """VisualBERT: LN_text(W_f f + visual_position_embeddings[0] + visual_token_type_embeddings[t]), then dropout.
    No box input; the LayerNorm is the text embeddings' own (one LayerNorm over the concatenated sequence in
    transformers ``VisualBertEmbeddings``). The position table is kept whole (as the checkpoints have it) though
    only row 0 is read without ``image_text_alignment``, which is not supported."""

    location_dim = 0

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        h = config.hidden_size
        self.feature_proj = nn.Linear(config.region_feature_dim, h)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, h)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, h)

    def forward(self, region_features, region_boxes, region_token_type_ids, text, masked_regions=None):
        x = self.feature_proj(region_features.to(self.feature_proj.weight.dtype)) + self.position_embeddings.weight[0]
        if region_token_type_ids is None:
            x = x + self.token_type_embeddings.weight[self.default_token_type]
        else:
            x = x + self.token_type_embeddings(region_token_type_ids)
        return self.dropout(text.norm(x))


class OscarRegionEmbeddings(RegionEmbedding):
    """Oscar: one Linear over [feature ; box6] (2048 + 6 = 2054 for the published checkpoints), then dropout; no
    type or position term (microsoft/Oscar ``BertImgModel``, ``img_embedding``)."""

    location_dim = 6
    layer_norm = False

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.proj = nn.Linear(config.region_feature_dim + 6, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if self.layer_norm else None

    def forward(self, region_features, region_boxes, region_token_type_ids, text, masked_regions=None):
        dtype = self.proj.weight.dtype
        x = self.proj(torch.cat([region_features.to(dtype), region_location_features(region_boxes.to(dtype), 6)], -1))
        return self.dropout(self.norm(x) if self.norm is not None else x)


class VinVLRegionEmbeddings(OscarRegionEmbeddings):
    """VinVL: Oscar's pathway with a LayerNorm after the projection (``use_img_layernorm`` 1)."""

    layer_norm = True


class LxmertRegionEmbeddings(RegionEmbedding):
    """LXMERT's object-level image embedding: (LN(W_f f) + LN(W_b box4)) / 2, then dropout, with box4 = (x1, y1,
    x2, y2) divided by the image's width and height (Tan and Bansal 2019, section 2.1; airsplay/lxmert@827087b
    ``src/lxrt/modeling.py`` ``VisualFeatEncoder``; transformers ``LxmertVisualFeatureEncoder``). No token type or
    position term; the regions feed the two-stream encoder's region layers (``config.encoder = "two-stream"``).
    Both LayerNorms use eps 1e-12 in the sources: ``config.layer_norm_eps`` (default 1e-12)."""

    location_dim = 4

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        h, eps = config.hidden_size, config.layer_norm_eps
        self.feature_proj = nn.Linear(config.region_feature_dim, h)
        self.feature_norm = nn.LayerNorm(h, eps=eps)
        self.location_proj = nn.Linear(4, h)
        self.location_norm = nn.LayerNorm(h, eps=eps)

    def forward(self, region_features, region_boxes, region_token_type_ids, text, masked_regions=None):
        dtype = self.feature_proj.weight.dtype
        x = self.feature_norm(self.feature_proj(region_features.to(dtype)))
        y = self.location_norm(self.location_proj(region_boxes.to(dtype)))
        return self.dropout((x + y) / 2)


#: config.region_embedding -> the pathway's class.
REGION_EMBEDDINGS: dict[str, type[RegionEmbedding]] = {
    "uniter": UniterRegionEmbeddings,
    "visualbert": VisualBertRegionEmbeddings,
    "oscar": OscarRegionEmbeddings,
    "vinvl": VinVLRegionEmbeddings,
    "lxmert": LxmertRegionEmbeddings,
}


def build_region_embedding(config: VLBertConfig) -> RegionEmbedding:
    """The :data:`REGION_EMBEDDINGS` entry ``config.region_embedding`` for ``config``.

    Raises:
        ValueError: an unknown name (the table's names listed), or a config the entry cannot read.
    """
    cls = REGION_EMBEDDINGS.get(config.region_embedding)
    if cls is None:
        raise ValueError(f"config.region_embedding={config.region_embedding!r} is not one of "
                         f"{sorted(REGION_EMBEDDINGS)}")
    cls.check_config(config)
    return cls(config)


__all__ = ["REGION_EMBEDDINGS", "RegionEmbedding", "UniterRegionEmbeddings", "VisualBertRegionEmbeddings",
           "OscarRegionEmbeddings", "VinVLRegionEmbeddings", "LxmertRegionEmbeddings",
           "build_region_embedding", "region_location_features"]
