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
| ``vl-bert`` | [IMG] + LN_o(ReLU(W [geo(box) ; f] + b)) + pos[n_text] + type[2]; text adds LN_t(v_image); [END] | jackroos/VL-BERT@4373674 |
| ``lxmert`` | (LN(W_f f) + LN(W_b box4)) / 2 | airsplay/lxmert ``src/lxrt/modeling.py`` ``VisualFeatEncoder`` |

(dropout after each, as the sources.) ``loc7`` = [x1, y1, x2, y2, w, h, w*h], ``box6`` = [x1, y1, x2, y2, w, h]
(:func:`region_location_features`), ``box4`` = [x1, y1, x2, y2]; ``type`` is row ``t`` of the text's token-type table for UNITER (default
1), of VisualBERT's own visual token-type table (published VQA/COCO checkpoints were trained with 0). Oscar and
VinVL have no type or position term.

VL-BERT (Su et al., ICLR 2020, section 3.2; jackroos/VL-BERT at 4373674, ``common/visual_linguistic_bert.py``
``VisualLinguisticBert.embedding``, ``common/fast_rcnn.py`` ``obj_downsample``, ``common/utils/bbox.py``
``coordinate_embeddings``, ``pretrain/modules/resnet_vlbert_for_pretraining_multitask.py``) also changes the text
tokens and adds a token, so its entry implements :meth:`RegionEmbedding.join` (the whole input sequence):

* the visual embedding of a box: ``v = ReLU(W [geo(box) ; f] + b)`` (dropout before W), ``geo`` the 2048-d sin/cos
  embedding of the box's centre, width and height (:func:`box_geometry_embedding`);
* text token i: ``word[id_i] + LN_text(v_image) + position[i] + type[t_i]``, ``v_image`` the visual embedding of the
  whole-image box (region 0 when it covers the image, as VL-BERT's data puts it first; otherwise the mean of the
  unmasked regions' features under the whole-image box; ``aux_text_visual_embedding`` for text alone);
* region j: ``[IMG] + LN_object(v_j) + position[n_text] + type[2]``; a masked region takes
  ``object_mask_word_embedding`` for [IMG] and, with precomputed features, ``mask_visual_embedding`` for f;
* one [END] token after the regions: ``end_embedding + position[n_text + 1] + type[2]``;
* the sum goes through the text's LayerNorm and dropout (VL-BERT's ``embedding_LayerNorm``). All regions share one
  position, so permuting them permutes their outputs. ``LN_text`` / ``LN_object`` start with gamma 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from vlbert.layers.kernels import Dropout

if TYPE_CHECKING:
    from vlbert.config import VLBertConfig
    from vlbert.models.bert import BertEmbeddings
    from vlbert.models.inputs import VLInputs


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
    """Base class of the table's entries. Each declares ``location_dim``, the size of the box feature it reads (0
    = no box input; the config's ``region_location_dim`` is filled from it, or checked against it), and
    ``masked_region_modules``, its submodules that only masked region modelling uses (a forward without
    ``masked_regions`` leaves them idle: :meth:`VLBertModel.idle_modules <vlbert.models.vl.VLBertModel.idle_modules>`).
    ``default_token_type`` (instance): the region token type when the inputs give none."""

    location_dim: int = 0
    masked_region_modules: tuple[str, ...] = ()
    #: tokens the entry adds after the regions (VL-BERT's [END]): they take part in attention and are dropped
    #: from the model's outputs.
    extra_tokens: int = 0

    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.default_token_type = config.region_token_type
        self.dropout = Dropout(config.hidden_dropout_prob)

    @classmethod
    def check_config(cls, config: VLBertConfig) -> None:
        """Raise ``ValueError`` when ``config`` does not fit this pathway (location size)."""
        if config.region_location_dim != cls.location_dim:
            raise ValueError(
                f"region_embedding={config.region_embedding!r} reads a {cls.location_dim}-d location "
                f"feature, but config.region_location_dim is {config.region_location_dim}; set it "
                f"to {cls.location_dim}"
            )

    def forward(self, inputs: VLInputs, text: BertEmbeddings) -> torch.Tensor:
        """The region rows float [B, R, H] of ``inputs`` (its ``region_features``, ``region_boxes``,
        ``region_token_type_ids``, ``masked_regions``: :class:`~vlbert.models.inputs.VLInputs`); ``text``: the
        model's text embeddings, whose tables some pathways share."""
        raise NotImplementedError

    def join(self, text: BertEmbeddings, inputs: VLInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's input: (embeddings float [B, T + R + extra_tokens, H], mask int64 [B, T + R +
        extra_tokens]), text rows first. Default: the text embeddings, then :meth:`forward`'s region rows."""
        x = text(inputs.input_ids, inputs.token_type_ids)
        regions = self(inputs, text)
        b, r = inputs.input_ids.shape[0], inputs.region_features.shape[1]
        reg_mask = inputs.region_mask if inputs.region_mask is not None else inputs.input_ids.new_ones(b, r)
        return (
            torch.cat([x, regions.to(x.dtype)], dim=1),
            torch.cat([inputs.text_mask.to(torch.long), reg_mask.to(torch.long)], dim=1),
        )


class UniterRegionEmbeddings(RegionEmbedding):
    """UNITER: LN(LN(W_f f) + LN(W_l loc7) + type[t]), then dropout; ``type`` is the text's token-type table
    (row 1 by default). In masked region modelling ``mask_embedding[1]`` is added to the (zeroed) feature of each
    masked region, row 0 (unmasked) being zero (UNITER ``UniterImageEmbeddings.forward``)."""

    location_dim = 7
    masked_region_modules = ("mask_embedding",)

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        h, eps = config.hidden_size, config.layer_norm_eps
        self.feature_proj = nn.Linear(config.region_feature_dim, h)
        self.feature_norm = nn.LayerNorm(h, eps=eps)
        self.location_proj = nn.Linear(7, h)
        self.location_norm = nn.LayerNorm(h, eps=eps)
        self.norm = nn.LayerNorm(h, eps=eps)
        self.mask_embedding = nn.Embedding(2, config.region_feature_dim, padding_idx=0)

    def forward(self, inputs: VLInputs, text: BertEmbeddings) -> torch.Tensor:
        dtype = self.feature_proj.weight.dtype
        f = inputs.region_features.to(dtype)
        if inputs.masked_regions is not None:
            f = f + self.mask_embedding(inputs.masked_regions.long())
        x = self.feature_norm(self.feature_proj(f))
        x = x + self.location_norm(self.location_proj(region_location_features(inputs.region_boxes.to(dtype), 7)))
        if inputs.region_token_type_ids is None:
            x = x + text.token_type_embeddings.weight[self.default_token_type]
        else:
            x = x + text.token_type_embeddings(inputs.region_token_type_ids)
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

    def forward(self, inputs: VLInputs, text: BertEmbeddings) -> torch.Tensor:
        features = inputs.region_features.to(self.feature_proj.weight.dtype)
        x = self.feature_proj(features) + self.position_embeddings.weight[0]
        if inputs.region_token_type_ids is None:
            x = x + self.token_type_embeddings.weight[self.default_token_type]
        else:
            x = x + self.token_type_embeddings(inputs.region_token_type_ids)
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

    def forward(self, inputs: VLInputs, text: BertEmbeddings) -> torch.Tensor:
        dtype = self.proj.weight.dtype
        location = region_location_features(inputs.region_boxes.to(dtype), 6)
        x = self.proj(torch.cat([inputs.region_features.to(dtype), location], -1))
        return self.dropout(self.norm(x) if self.norm is not None else x)


class VinVLRegionEmbeddings(OscarRegionEmbeddings):
    """VinVL: Oscar's pathway with a LayerNorm after the projection (``use_img_layernorm`` 1)."""

    layer_norm = True


#: sin/cos frequencies per box coordinate (VL-BERT ``fast_rcnn.py`` passes 256): 4 x 2 x 256 = 2048 geometry dims.
GEOMETRY_FREQUENCIES = 256
#: a region whose normalised box reaches within this of every image border is the whole-image box.
WHOLE_IMAGE_TOLERANCE = 0.02


def box_geometry_embedding(boxes: torch.Tensor, frequencies: int = GEOMETRY_FREQUENCIES) -> torch.Tensor:
    """VL-BERT's geometry embedding of boxes (``common/utils/bbox.py`` ``coordinate_embeddings`` at 4373674).

    Args:
        boxes: float [..., 4] = (x1, y1, x2, y2) normalised to [0, 1] by image width and height (VL-BERT divides
            pixel boxes by the image size, which is the same).
        frequencies: sin/cos pairs per coordinate (256).
    Returns:
        float [..., 4 * 2 * frequencies]: for each of (centre x, centre y, width, height) x 100, in that order, its
        sines then its cosines at 1000^(k / frequencies), k < frequencies.
    """
    x1, y1, x2, y2 = boxes.unbind(-1)
    pos = torch.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], -1) * 100
    scale = 1000 ** (torch.arange(frequencies, dtype=boxes.dtype, device=boxes.device) / frequencies)
    angles = pos[..., None] / scale
    return torch.cat([angles.sin(), angles.cos()], -1).flatten(-2)


def is_whole_image(boxes: torch.Tensor) -> torch.Tensor:
    """bool [...]: whether each normalised (x1, y1, x2, y2) box [..., 4] covers the image (within
    :data:`WHOLE_IMAGE_TOLERANCE`; VL-BERT's own whole-image box is (0, 0, w - 1, h - 1) in pixels)."""
    low = (boxes[..., :2] <= WHOLE_IMAGE_TOLERANCE).all(-1)
    return low & (boxes[..., 2:] >= 1 - WHOLE_IMAGE_TOLERANCE).all(-1)


class VLBertRegionEmbeddings(RegionEmbedding):
    """VL-BERT's pathway (the module docstring has the equations and sources). Checkpoint names (``vlbert.families.vl_bert``):
    ``visual_proj`` = ``image_feature_extractor.obj_downsample.1``; ``visual_ln_text`` / ``visual_ln_object``;
    ``object_embedding`` = ``object_linguistic_embeddings`` ([IMG]); ``object_mask_embedding`` =
    ``object_mask_word_embedding``; ``mask_visual_embedding`` = ``object_mask_visual_embedding``;
    ``aux_text_visual_embedding``; ``end_embedding`` (VL-BERT's ``vlbert.end_embedding``)."""

    location_dim = 4
    extra_tokens = 1

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        h, eps = config.hidden_size, config.layer_norm_eps
        self.visual_proj = nn.Linear(4 * 2 * GEOMETRY_FREQUENCIES + config.region_feature_dim, h)
        self.visual_ln_text = nn.LayerNorm(h, eps=eps)
        self.visual_ln_object = nn.LayerNorm(h, eps=eps)
        self.object_embedding = nn.Embedding(1, h)
        self.object_mask_embedding = nn.Embedding(1, h)
        self.aux_text_visual_embedding = nn.Embedding(1, h)
        self.end_embedding = nn.Embedding(1, h)
        backbone = config.visual_backbone
        #: precomputed features, or a backbone that does not hide masked pixels: a masked region's feature becomes
        #: ``mask_visual_embedding`` (with pixel masking VL-BERT has no such parameter)
        self.replace_masked_features = not backbone or backbone.get("mask_pixels", True) is False
        self.mask_visual_embedding = (
            nn.Parameter(torch.zeros(config.region_feature_dim)) if self.replace_masked_features else None
        )

    def _init_own_weights(self, std: float) -> None:
        """After the generic init (children first): LN_text / LN_object gamma 0 (VL-BERT ``visual_scale_*_init``
        0.0 in its published configs), the mask feature 0 (``object_mask_visual_embedding`` filled with 0)."""
        with torch.no_grad():
            self.visual_ln_text.weight.zero_()
            self.visual_ln_object.weight.zero_()
            if self.mask_visual_embedding is not None:
                self.mask_visual_embedding.zero_()

    def visual(self, features: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """``ReLU(W [geometry(box) ; feature] + b)``: features float [..., D], boxes [..., 4] normalised xyxy ->
        float [..., H] (VL-BERT ``FastRCNN.obj_downsample``: Dropout, Linear, ReLU)."""
        dtype = self.visual_proj.weight.dtype
        x = torch.cat([box_geometry_embedding(boxes.to(dtype)), features.to(dtype)], -1)
        return torch.relu(self.visual_proj(self.dropout(x)))

    def image_visual(self, features, boxes, region_mask, masked) -> torch.Tensor:
        """float [B, H]: the visual embedding every text token adds (see the module docstring)."""
        keep = (region_mask.bool() & ~masked).unsqueeze(-1).to(features.dtype)
        mean = (features * keep).sum(1) / keep.sum(1).clamp(min=1)
        # the whole-image box (0, 0, 1, 1), made on the device (a host tensor would be a copy the host waits for)
        whole = (torch.arange(4, device=boxes.device) >= 2).to(boxes.dtype).expand_as(boxes[:, 0])
        first = self.visual(features[:, 0], boxes[:, 0])
        pooled = self.visual(mean, whole)
        return torch.where(is_whole_image(boxes[:, 0]).unsqueeze(-1), first, pooled)

    def objects(
        self, text: BertEmbeddings, inputs: VLInputs, region_type: torch.Tensor, n_text: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the image's visual embedding float [B, H] that every word adds, the object rows float [B, R, H], the
        region mask [B, R]) of ``inputs``; R = 0 without regions (the text-only embedding). ``region_type``: int64
        [B, R] or [B, 1]; ``n_text``: int64 [B], each text's length (the objects share the position after it)."""
        b, word_table = inputs.input_ids.shape[0], text.word_embeddings.weight
        if inputs.region_features is None:
            image = self.aux_text_visual_embedding.weight.expand(b, -1)
            return image, word_table.new_zeros(b, 0, word_table.shape[1]), inputs.text_mask.new_zeros(b, 0)
        r = inputs.region_features.shape[1]
        region_mask = inputs.region_mask if inputs.region_mask is not None else inputs.text_mask.new_ones(b, r)
        masked = inputs.masked_regions
        masked = masked.bool() if masked is not None else region_mask.new_zeros(b, r).bool()
        features = inputs.region_features.to(self.visual_proj.weight.dtype)
        if self.replace_masked_features:
            features = torch.where(masked.unsqueeze(-1), self.mask_visual_embedding.to(features.dtype), features)
        # the text-only embedding enters with weight zero: every parameter is in every graph (DDP)
        image = (
            self.image_visual(features, inputs.region_boxes, region_mask, masked)
            + 0.0 * self.aux_text_visual_embedding.weight
        )
        word = torch.where(masked.unsqueeze(-1), self.object_mask_embedding.weight[0], self.object_embedding.weight[0])
        objects = (
            word
            + self.visual_ln_object(self.visual(features, inputs.region_boxes))
            + text.position_embeddings(n_text)[:, None]
            + text.token_type_embeddings(region_type.expand(b, r))
        )
        return image, objects, region_mask

    def join(self, text: BertEmbeddings, inputs: VLInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole sequence [text T ; regions R ; END 1] -> (embeddings float [B, T + R + 1, H], mask int64
        [B, T + R + 1]). ``region_features`` None: text alone (R = 0), as VL-BERT's text-only corpus."""
        (b, t), device, text_mask = inputs.input_ids.shape, inputs.input_ids.device, inputs.text_mask
        n_text = text_mask.sum(1)
        region_type = inputs.region_token_type_ids
        if region_type is None:
            region_type = torch.full((b, 1), self.default_token_type, device=device)
        image, objects, region_mask = self.objects(text, inputs, region_type, n_text)
        words = text.word_embeddings(inputs.input_ids) + self.visual_ln_text(image)[:, None]
        words = words + text.position_embeddings(torch.arange(t, device=device))
        words = words + (
            text.token_type_embeddings(inputs.token_type_ids)
            if inputs.token_type_ids is not None
            else text.token_type_embeddings.weight[0]
        )
        end = (
            self.end_embedding.weight[0]
            + text.position_embeddings(n_text + 1)
            + text.token_type_embeddings(region_type[:, -1])
        )[:, None]
        x = torch.cat([words, objects.to(words.dtype), end.to(words.dtype)], 1)
        mask = torch.cat([text_mask.long(), region_mask.long(), text_mask.new_ones(b, 1).long()], 1)
        return text.dropout(text.norm(x)), mask

    def forward(self, inputs: VLInputs, text: BertEmbeddings) -> torch.Tensor:
        raise TypeError("VL-BERT's pathway embeds text and regions together: call join()")


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

    def forward(self, inputs: VLInputs, text: BertEmbeddings) -> torch.Tensor:
        dtype = self.feature_proj.weight.dtype
        x = self.feature_norm(self.feature_proj(inputs.region_features.to(dtype)))
        y = self.location_norm(self.location_proj(inputs.region_boxes.to(dtype)))
        return self.dropout((x + y) / 2)


#: config.region_embedding -> the pathway's class.
REGION_EMBEDDINGS: dict[str, type[RegionEmbedding]] = {
    "uniter": UniterRegionEmbeddings,
    "visualbert": VisualBertRegionEmbeddings,
    "oscar": OscarRegionEmbeddings,
    "vinvl": VinVLRegionEmbeddings,
    "vl-bert": VLBertRegionEmbeddings,
    "lxmert": LxmertRegionEmbeddings,
}


def build_region_embedding(config: VLBertConfig) -> RegionEmbedding:
    """The :data:`REGION_EMBEDDINGS` entry ``config.region_embedding`` for ``config``.

    A ``config.region_location_dim`` of None is set to the entry's declared ``location_dim`` (so the saved
    config.json records it).

    Raises:
        ValueError: an unknown name (the table's names listed), or a config the entry cannot read.
    """
    cls = REGION_EMBEDDINGS.get(config.region_embedding)
    if cls is None:
        raise ValueError(
            f"config.region_embedding={config.region_embedding!r} is not one of {sorted(REGION_EMBEDDINGS)}"
        )
    if config.region_location_dim is None:
        config.region_location_dim = cls.location_dim
    cls.check_config(config)
    return cls(config)


__all__ = [
    "REGION_EMBEDDINGS",
    "RegionEmbedding",
    "UniterRegionEmbeddings",
    "VisualBertRegionEmbeddings",
    "OscarRegionEmbeddings",
    "VinVLRegionEmbeddings",
    "VLBertRegionEmbeddings",
    "LxmertRegionEmbeddings",
    "build_region_embedding",
    "region_location_features",
    "box_geometry_embedding",
    "is_whole_image",
]
