"""The models' inputs: :class:`VLInputs`, the one typed input of every vision-language forward, and
:func:`check_text_inputs`, which refuses text a model cannot embed with a message naming the fix (values checked on
the host only: on an accelerator a check would stall every step). The collator's unpadded layout is checked where
the encoder reads it (:meth:`~vlbert.layers.unpadded.UnpaddedLayout.unpadding`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from vlbert.config import BertConfig
from vlbert.layers.unpadded import Layout, pop_legacy_layout


@dataclass
class VLInputs:
    """One vision-language forward's inputs, passed by name (DESIGN "Names and shapes"; transformers' batch keys).

    Text: ``input_ids`` int64 [B, T] ([CLS] first), ``token_type_ids`` int64 [B, T] (default all 0),
    ``attention_mask`` [B, T] (1 = real token; default all 1).
    Regions (all None for text alone): ``region_features`` float [B, R, D] RoI features (float16 accepted),
    ``region_boxes`` float [B, R, 4] (x1, y1, x2, y2) normalised to [0, 1] by the image's width and height,
    ``region_mask`` [B, R] (1 = real region; default all 1), ``region_token_type_ids`` int64 [B, R] (default
    ``config.region_token_type``), ``masked_regions`` bool [B, R] (regions masked for masked region modelling: the
    model zeroes their features, or hides their pixels).
    Pixels instead of features, for a model with a visual backbone: ``images`` float [B, 3, H, W] and
    ``image_sizes`` int64 [B, 2] (height, width in pixels of each image in a padded batch); the model pools them
    under ``region_boxes`` (:meth:`~vlbert.models.vl.VLBertModel.with_region_features`, the one place).
    ``layout``: the collator's unpadded layout (:mod:`vlbert.layers.unpadded`), so the model never reads a mask on
    the device.

    A forward takes one as its first argument or its fields as keywords (``model(**batch)``): :meth:`take`.
    """

    input_ids: torch.Tensor | None = None
    token_type_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    region_features: torch.Tensor | None = None
    region_boxes: torch.Tensor | None = None
    region_mask: torch.Tensor | None = None
    region_token_type_ids: torch.Tensor | None = None
    masked_regions: torch.Tensor | None = None
    images: torch.Tensor | None = None
    image_sizes: torch.Tensor | None = None
    layout: Layout = None

    @classmethod
    def take(cls, inputs: VLInputs | torch.Tensor | None, keywords: dict) -> VLInputs:
        """A forward's inputs from its first argument and its keywords: the fields of this class are taken out of
        ``keywords`` (what stays is the caller's: targets, labels). ``inputs`` is a :class:`VLInputs`, the
        ``input_ids`` tensor given by position, or None (every field a keyword). The batch keys of an unpadded
        layout before it was one field (``packed_indices``, ``cu_seqlens``: :data:`~vlbert.layers.unpadded.
        LEGACY_KEYS`) are read into ``layout`` here, the one place.

        Raises:
            TypeError: a :class:`VLInputs` and fields as keywords both, ``input_ids`` twice, or a first argument that
                is neither (a batch dict: pass it as keywords, ``model(**batch)``)."""
        if inputs is not None and not isinstance(inputs, (VLInputs, torch.Tensor)):
            raise TypeError(
                f"a forward's first argument is a VLInputs or the input_ids tensor, not {type(inputs).__name__}; "
                "pass a batch dict as keywords: model(**batch)"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        given = {k: keywords.pop(k) for k in list(keywords) if k in names}
        if isinstance(inputs, VLInputs):
            if given:
                raise TypeError(f"give the inputs as one VLInputs or as keywords, not both (also got {sorted(given)})")
            taken = inputs
        else:
            if inputs is not None and "input_ids" in given:
                raise TypeError("input_ids given twice: by position and as a keyword")
            taken = cls(**given, **({"input_ids": inputs} if inputs is not None else {}))
        layout = pop_legacy_layout(taken.layout, keywords)
        return taken if layout is taken.layout else taken.replace(layout=layout)

    def replace(self, **changes) -> VLInputs:
        """A copy with ``changes`` (field name -> value); this one unchanged."""
        return dataclasses.replace(self, **changes)

    def text_only(self) -> VLInputs:
        """The text fields alone (regions, pixels and the joint layout dropped)."""
        return VLInputs(self.input_ids, self.token_type_ids, self.attention_mask)

    def regions_alone(self, layout: Layout = None) -> VLInputs:
        """The regions after each caption's own [CLS] and [SEP] (its first and last real token, read on the device:
        no host sync), no other text: the image's unimodal pass of the shared encoder (ITM's hard negatives, ITC).
        ``layout``: the unpadded layout of [CLS] [SEP] + regions, [B, 2 + R]
        (:func:`~vlbert.layers.unpadded.regions_alone_layout`), or None."""
        ids = self.input_ids
        rows = torch.arange(ids.shape[0], device=ids.device)
        cls_sep = torch.stack([ids[:, 0], ids[rows, self.text_mask.sum(1) - 1]], 1)
        return self.replace(input_ids=cls_sep, token_type_ids=None, attention_mask=None, layout=layout)

    def rows(self, text_rows: torch.Tensor, image_rows: torch.Tensor) -> VLInputs:
        """Pairs of another batch's rows: text row ``text_rows[i]`` with the regions of ``image_rows[i]`` (int64
        [N] each; ITM's negatives). No layout: the host cannot know the new rows' without waiting."""

        def pick(t, rows):
            return None if t is None else t[rows]

        return VLInputs(
            *(pick(t, text_rows) for t in (self.input_ids, self.token_type_ids, self.attention_mask)),
            **{
                f: pick(getattr(self, f), image_rows)
                for f in ("region_features", "region_boxes", "region_mask", "region_token_type_ids", "masked_regions")
            },
        )

    def image_pairs(self, region_types: tuple[int, int] | None, joined: bool) -> VLInputs:
        """Two images per text (regions [B, 2, R, ...], image 0 = left, as the collator pads NLVR2's pairs) in the
        layout the encoder reads: ``joined`` False, each text once with each image, [2B, ...] (rows 2i, 2i + 1:
        text i with its left, right image; the collator's layout describes these rows); ``joined`` True, each text
        with both images' regions in one sequence, [B, 2R, ...] (no layout: the collator's is of the rows).
        ``region_types``: each image's region token type, or None to keep ``region_token_type_ids`` as given.

        Raises:
            ValueError: regions that are not [B, 2, R, D]."""
        features = self.region_features
        if features is None or features.dim() != 4 or features.shape[:2] != (self.input_ids.shape[0], 2):
            shape = None if features is None else tuple(features.shape)
            raise ValueError(f"region_features must be [batch, 2, regions, dim] (left and right image), got {shape}")
        types = self.region_token_type_ids
        if region_types is not None:
            b, two, r = features.shape[:3]
            types = torch.tensor(region_types, device=features.device).repeat_interleave(r).view(1, two, r)
            types = types.expand(b, -1, -1)

        def regions(t):  # [B, 2, R, ...] -> [2B, R, ...] or [B, 2R, ...]
            return None if t is None else t.flatten(1, 2) if joined else t.flatten(0, 1)

        def text(t):  # [B, T] -> [2B, T]: each text once per image
            return t if joined or t is None else t.repeat_interleave(2, dim=0)

        return VLInputs(
            text(self.input_ids),
            text(self.token_type_ids),
            text(self.attention_mask),
            regions(features),
            regions(self.region_boxes),
            regions(self.region_mask),
            regions(types),
            layout=None if joined else self.layout,
        )

    @property
    def text_mask(self) -> torch.Tensor:
        """``attention_mask``, or all 1 [B, T] where not given."""
        return self.attention_mask if self.attention_mask is not None else torch.ones_like(self.input_ids)

    @property
    def regions_mask(self) -> torch.Tensor | None:
        """``region_mask``, or all 1 [B, R] (the features' dtype) where not given; None without regions."""
        if self.region_mask is not None or self.region_features is None:
            return self.region_mask
        return torch.ones_like(self.region_features[..., 0])


def check_text_inputs(
    config: BertConfig,
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
) -> None:
    """Raise ``ValueError`` for text inputs a model of ``config`` cannot embed, naming the input and the fix:
    not [B, T] integer ids, T beyond ``max_position_embeddings``, token_type_ids/attention_mask of another shape,
    ids outside the embedding tables (``vocab_size``, ``type_vocab_size``), or a row with no real token.

    Shapes are always checked; values are checked on CPU tensors. On an accelerator a value check would stall
    the host on every step, so there an out-of-range id becomes an asynchronous device assertion instead.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, seq_len], got shape {tuple(input_ids.shape)}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
    if input_ids.shape[1] > config.max_position_embeddings:
        raise ValueError(
            f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings="
            f"{config.max_position_embeddings}; truncate inputs (e.g. max_seq_length) to at most that"
        )
    for name, t in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask)):
        if t is not None and t.shape != input_ids.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but input_ids has {tuple(input_ids.shape)}")
    if torch.compiler.is_compiling() or input_ids.numel() == 0:
        return
    ranges = [("input_ids", input_ids, config.vocab_size, "the tokenizer saved with the checkpoint")]
    if token_type_ids is not None:
        ranges.append(("token_type_ids", token_type_ids, config.type_vocab_size, "0 (segment A) and 1 (segment B)"))
    for name, ids, size, fix in ranges:
        if ids.device.type != "cpu":
            torch._assert_async(((ids >= 0) & (ids < size)).all(), f"{name} outside [0, {size})")
            continue
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= size:
            raise ValueError(
                f"{name} holds {low if low < 0 else high}, outside the model's table of {size} entries; use {fix}"
            )
    if attention_mask is not None and attention_mask.device.type == "cpu" and not attention_mask.any(1).all():
        row = int((~attention_mask.bool().any(1)).nonzero()[0])
        raise ValueError(f"attention_mask row {row} has no real token (all 0); every sequence needs at least [CLS]")


#: The batch keys a vision-language forward takes as its inputs (the fields of :class:`VLInputs`): the models'
#: ``input_names`` (:func:`vlbert.utils.forward_arguments`).
VL_INPUT_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(VLInputs))

__all__ = ["VLInputs", "VL_INPUT_NAMES", "check_text_inputs"]
