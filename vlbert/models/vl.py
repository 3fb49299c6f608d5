"""Single-stream vision-language BERT: text wordpieces and detector regions in one Transformer encoder.

Source: UNITER (Chen et al. 2020, section 3.1 and 3.2) for region embeddings (projected RoI feature + projected
7-d location [x1, y1, x2, y2, w, h, w*h], each layer-normed, plus a segment embedding) and the pretraining
objectives (MLM conditioned on the image, masked region feature regression and KL classification, image-text
matching, one modality masked at a time); VisualBERT (Li et al. 2019) for initialising the shared encoder from
BERT. Regions carry no position ids, so the encoder treats them as an unordered set.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from vlbert.config import VLBertConfig
from vlbert.layers.unpadded import StreamLayouts, unpadding
from vlbert.models.bert import BertModel, run_padded
from vlbert.models.inputs import VL_INPUT_NAMES, VLInputs, check_text_inputs
from vlbert.models.objective_units import UnitPreTrainingModel
from vlbert.models.outputs import EncoderOutput, PreTrainingOutput
from vlbert.models.region_embeddings import build_region_embedding
from vlbert.models.text_towers import TEXT_TOWERS
from vlbert.models.two_stream import TwoStreamEncoder
from vlbert.models.visual_backbone import RegionFeatureExtractor
from vlbert.objectives import Encoded


class SingleStream:
    """``config.encoder = "single-stream"``: one encoder over [text ; regions], the text tower's
    (:data:`~vlbert.models.text_towers.TEXT_TOWERS`: BERT's :class:`~vlbert.models.bert.BertEncoder` or ModernBERT's),
    embedded together by the region pathway (``RegionEmbedding.join``; text alone: the tower's text embeddings),
    unpadded by the collator's :class:`~vlbert.layers.unpadded.UnpaddedLayout` of the joint mask (else read from the
    mask)."""

    @staticmethod
    def build(config: VLBertConfig) -> nn.Module:
        """The text tower's encoder for ``config``."""
        return TEXT_TOWERS[config.text_tower].encoder(config)

    def encode(self, model: "VLBertModel", inputs: VLInputs, hidden: bool, attentions: bool):
        """Embeddings -> encoder -> :class:`EncoderOutput` (no pooler) of ``model``; ``hidden`` / ``attentions``:
        output_hidden_states / output_attentions. Tokens a pathway adds after the regions (VL-BERT's [END]) take
        part in attention, extend the layout on the device, and are dropped from the states."""
        extra = model.region_embeddings.extra_tokens
        if inputs.region_features is None and not extra:  # text alone: BERT's embeddings
            x, mask = model.embeddings(inputs.input_ids, inputs.token_type_ids), inputs.attention_mask
        else:
            x, mask = model.region_embeddings.join(model.embeddings, inputs)
        unpadded = unpadding(inputs.layout, mask[:, : mask.shape[1] - extra] if extra else mask)
        if extra and unpadded is not None:  # VL-BERT's [END] after the regions, added on the device
            unpadded = unpadded.append(extra)
        text_length = inputs.input_ids.shape[1] if x.shape[1] > inputs.input_ids.shape[1] else None
        out = TEXT_TOWERS[model.config.text_tower].encode(
            model.encoder, x, mask, hidden, attentions, unpadded, text_length
        )
        if extra:
            keep = x.shape[1] - extra
            out.last_hidden_state = out.last_hidden_state[:, :keep]
            if out.hidden_states is not None:
                out.hidden_states = tuple(h[:, :keep] for h in out.hidden_states)
        return out


class TwoStream:
    """``config.encoder = "two-stream"`` (LXMERT): the text and region embeddings each in their own stream of
    :class:`~vlbert.models.two_stream.TwoStreamEncoder`, on the collator's per-stream
    :class:`~vlbert.layers.unpadded.StreamLayouts` (no host sync); given the joint layout of [text ; regions],
    which the streams cannot use, they run padded with their masks (no host sync, ``sdpa``); given none, each is
    unpadded by its own mask (one ``nonzero`` each). Text alone runs the language layers (LXMERT's language
    encoder, a BERT)."""

    @staticmethod
    def build(config: VLBertConfig) -> nn.Module:
        """LXMERT's :class:`~vlbert.models.two_stream.TwoStreamEncoder` for ``config`` (a BERT text tower)."""
        return TwoStreamEncoder(config)

    def encode(self, model: "VLBertModel", inputs: VLInputs, hidden: bool, attentions: bool):
        """Embeddings -> encoder -> :class:`EncoderOutput` (no pooler; each stream's states and attention maps
        besides the joint ones)."""
        text, layout = model.embeddings(inputs.input_ids, inputs.token_type_ids), inputs.layout
        if inputs.region_features is None:  # the language layers alone, on the text stream's layout
            text_layout = layout.text if isinstance(layout, StreamLayouts) else layout
            mask = inputs.attention_mask
            return model.encoder.text(text, mask, hidden, attentions, unpadding(text_layout, mask))
        regions = model.region_embeddings(inputs, model.embeddings)
        return model.encoder(
            text, regions.to(text.dtype), inputs.attention_mask, inputs.region_mask, hidden, attentions, layout
        )


#: config.encoder -> how the model embeds and encodes (its encoder class and path): one encoder over
#: [text ; regions] (a stack of BERT layers) or LXMERT's two streams. Chosen once, at construction.
ENCODERS = {"single-stream": SingleStream, "two-stream": TwoStream}


class VLBertModel(BertModel):
    """BERT over [text ; regions]: a :class:`~vlbert.models.bert.BertModel` (its embeddings, encoder and pooler)
    plus a region pathway. The text embeddings and
    the region pathway ``config.region_embedding`` (an entry
    of :data:`~vlbert.models.region_embeddings.REGION_EMBEDDINGS`: UNITER, VisualBERT, Oscar or VinVL)
    concatenated along the sequence, one encoder, a joint attention mask. ``last_hidden_state`` is [B, T + R, H],
    text positions first; the pooler reads the text's [CLS].

    Initialise the shared encoder from any BERT checkpoint with ``VLBertModel.from_pretrained(dir,
    region_feature_dim=...)``: the region embeddings are then newly initialised (listed in ``loading_info``).
    ``config.text_tower`` picks the text embeddings and single-stream encoder from
    :data:`~vlbert.models.text_towers.TEXT_TOWERS` (BERT, or ModernBERT: what a ModernBERT directory given to
    ``from_pretrained`` chooses; how regions join it is said there).

    ``config.encoder`` picks the encoder from :data:`ENCODERS`: "single-stream" (the above) or "two-stream"
    (LXMERT: :class:`~vlbert.models.two_stream.TwoStreamEncoder`, text and regions in their own layers, then
    cross-modality layers). Its outputs keep the shapes above: ``last_hidden_state`` [B, T + R, H] text rows first,
    the pooler on the text's [CLS]; it needs regions.
    """

    config_class = VLBertConfig
    input_names = VL_INPUT_NAMES

    def add_inputs(self, config: VLBertConfig) -> None:
        """The region pathway (:data:`~vlbert.models.region_embeddings.REGION_EMBEDDINGS`) and, when the config has
        one, the visual backbone. Raises ValueError when the backbone's feature size is not the config's."""
        self.region_embeddings = build_region_embedding(config)
        self.visual_backbone = RegionFeatureExtractor(config.visual_backbone) if config.visual_backbone else None
        if self.visual_backbone is not None and self.visual_backbone.feature_dim != config.region_feature_dim:
            raise ValueError(
                f"config.visual_backbone gives {self.visual_backbone.feature_dim}-d region features but "
                f"config.region_feature_dim is {config.region_feature_dim}; set it to "
                f"{self.visual_backbone.feature_dim}"
            )

    def build_encoder(self, config: VLBertConfig) -> nn.Module:
        """``ENCODERS[config.encoder]``'s encoder (one over [text ; regions], or LXMERT's two streams); the path
        that runs it is kept as ``self.path`` (:class:`SingleStream` or :class:`TwoStream`)."""
        self.path = ENCODERS[config.encoder]()
        return self.path.build(config)

    def build_embeddings(self, config: VLBertConfig) -> nn.Module:
        """The text tower's embeddings (:data:`~vlbert.models.text_towers.TEXT_TOWERS`): BERT's, or ModernBERT's
        with the regions' modality table."""
        return TEXT_TOWERS[config.text_tower].embeddings(config)

    def idle_modules(self, masked_regions: torch.Tensor | None = None) -> list[nn.Module]:
        """Submodules a forward without ``masked_regions`` never uses: those the region pathway declares
        (``RegionEmbedding.masked_region_modules``: UNITER's ``mask_embedding``). Models declare them unused
        (``ObjectiveOutput.add_unused``) for DDP: :meth:`UnitPreTrainingModel.idle_modules
        <vlbert.models.objective_units.UnitPreTrainingModel.idle_modules>`, ``VLBertForTask.idle_modules``."""
        if masked_regions is not None:
            return []
        return [self.region_embeddings.get_submodule(name) for name in self.region_embeddings.masked_region_modules]

    def extract_regions(
        self,
        images: torch.Tensor,
        region_boxes: torch.Tensor,
        region_mask: torch.Tensor | None,
        image_sizes: torch.Tensor | None = None,
        masked_regions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Region features [B, R, region_feature_dim] computed from ``images`` under ``region_boxes`` by the
        model's visual backbone (:class:`~vlbert.models.visual_backbone.RegionFeatureExtractor`; arguments there);
        with n images per text (images [B, n, 3, H, W], region_boxes [B, n, R, 4], region_mask [B, n, R],
        image_sizes [B, n, 2]: the region collator's layout for NLVR2's pairs) [B, n, R, region_feature_dim].

        Raises:
            ValueError: the config has no ``visual_backbone``, or no boxes are given.
        """
        if self.visual_backbone is None:
            raise ValueError(
                "images were given but config.visual_backbone is None; give region_features, or build "
                "the model with a visual_backbone section"
            )
        if region_boxes is None:
            raise ValueError("images need region_boxes: the boxes whose features the backbone pools")
        images = images.to(self.embeddings.word_embeddings.weight.dtype)  # the collator's float32, as the model
        if images.dim() == 5:  # n images per text (NLVR2's pairs): [B, n, 3, H, W], boxes [B, n, R, 4]

            def flat(t):
                return None if t is None else t.flatten(0, 1)

            features = self.visual_backbone(
                flat(images), flat(region_boxes), flat(region_mask), flat(image_sizes), flat(masked_regions)
            )
            return features.unflatten(0, tuple(images.shape[:2]))
        return self.visual_backbone(images, region_boxes, region_mask, image_sizes, masked_regions)

    def check_region_inputs(self, inputs: VLInputs) -> None:
        """Raise ``ValueError`` for region inputs of the wrong shape, or features without the boxes the pathway
        reads (shape checks only: no device sync). Nothing to check for text alone."""
        region_features, region_boxes = inputs.region_features, inputs.region_boxes
        if region_features is None:
            return
        if region_boxes is None and self.region_embeddings.location_dim:
            raise ValueError("region_boxes are required with region_features")
        b = inputs.input_ids.shape[0]
        d = self.config.region_feature_dim
        if region_features.dim() != 3 or region_features.shape[0] != b or region_features.shape[2] != d:
            raise ValueError(
                f"region_features must be [batch={b}, regions, region_feature_dim={d}], got "
                f"{tuple(region_features.shape)}; the detector's feature size must equal config.region_feature_dim"
            )
        r = region_features.shape[1]
        if r == 0:
            raise ValueError(
                "region_features has zero regions; every image needs at least one region "
                "(the whole-image box is always a valid region)"
            )
        if region_boxes is not None and region_boxes.shape != (b, r, 4):
            raise ValueError(
                f"region_boxes must be [{b}, {r}, 4] normalised (x1, y1, x2, y2), got {tuple(region_boxes.shape)}"
            )
        for name in ("region_mask", "region_token_type_ids", "masked_regions"):
            t = getattr(inputs, name)
            if t is not None and t.shape != (b, r):
                raise ValueError(f"{name} must be [{b}, {r}], got {tuple(t.shape)}")

    def with_region_features(self, inputs: VLInputs) -> VLInputs:
        """The region features the encoder reads, the one place: ``inputs`` with ``region_features`` computed from
        its ``images`` under its ``region_boxes`` (:meth:`extract_regions`; masked regions' pixels hidden there) and
        the pixels dropped; given features with the ``masked_regions``' rows zeroed (UNITER section 3.2; on the
        device, so the batch sends the features once and MRFR gathers its targets from them); ``inputs`` itself
        where it carries neither pixels nor masked regions.

        Raises:
            ValueError: as :meth:`extract_regions`."""
        if inputs.images is None:
            features, masked = inputs.region_features, inputs.masked_regions
            if features is None or masked is None or masked.shape != features.shape[:-1]:
                return inputs  # a wrong shape: check_region_inputs names it
            return inputs.replace(region_features=features.masked_fill(masked.bool().unsqueeze(-1), 0.0))
        features = self.extract_regions(
            inputs.images, inputs.region_boxes, inputs.region_mask, inputs.image_sizes, inputs.masked_regions
        )
        return inputs.replace(region_features=features, images=None, image_sizes=None)

    def forward(
        self,
        inputs: VLInputs | torch.Tensor | None = None,
        /,
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        **fields,
    ) -> EncoderOutput:
        """Encode text and regions jointly.

        Args:
            inputs: a :class:`~vlbert.models.inputs.VLInputs` (shapes and units there), or its fields as keywords
                (``model(**batch)``; ``input_ids`` may come by position). Text alone (no region fields) is BERT.
            output_hidden_states: also return per-layer hidden states over all T + R positions.
            output_attentions: also return each layer's attention probabilities [B, heads, T + R, T + R] (text
                positions first: rows/columns T.. are the regions).
        Returns:
            :class:`EncoderOutput`, last_hidden_state [B, T + R, H] (text rows first), pooler_output [B, H].
            Without regions this is exactly :class:`BertModel` (VL-BERT's pathway: its text-only embedding); for a
            two-stream model, its language layers alone (LXMERT's language encoder, a BERT), then the pooler.
            Tokens a pathway adds (VL-BERT's [END]) take part in attention and are dropped from
            ``last_hidden_state`` and ``hidden_states``; ``attentions`` keep them ([B, heads, S, S], S = T + R + 1).
        Raises:
            TypeError: a keyword that is not a field of VLInputs, or no input_ids.
            ValueError: text input errors (see BertModel), feature size other than config.region_feature_dim,
                zero regions, or mismatched box/mask shapes; a per-stream layout for a single-stream model.
        The path (:data:`ENCODERS`: :class:`SingleStream` or :class:`TwoStream`) was chosen at construction.
        """
        inputs = VLInputs.take(inputs, fields)
        if fields or inputs.input_ids is None:
            raise TypeError(
                f"{type(self).__name__}.forward takes the fields of VLInputs; got {sorted(fields) or 'no input_ids'}"
            )
        check_text_inputs(self.config, inputs.input_ids, inputs.token_type_ids, inputs.attention_mask)
        inputs = self.with_region_features(inputs)
        self.check_region_inputs(inputs)
        out = self.path.encode(self, inputs, output_hidden_states, output_attentions)
        out.pooler_output = self.pooler(out.last_hidden_state) if self.pooler is not None else None
        return out


class VLBertForPreTraining(UnitPreTrainingModel):
    """Vision-language pretraining heads over :class:`VLBertModel` (UNITER section 3.2).

    Each objective is a unit of :mod:`vlbert.objectives` (its head is built here under the unit's attribute name,
    its loss computed where its labels are given):
      * ``mlm``: masked LM on text conditioned on the regions (``labels`` [B, T], -100 = not masked);
      * ``mrfr``: masked region feature regression (``masked_regions`` bool [B, R], ``region_targets`` [B, R, D],
        the masked rows [M, D], or int64 [M], the masked regions' flat positions in ``region_features``, gathered
        on the device as the collator asks);
      * ``mrc``: masked region classification against the detector's top class (``region_class_labels`` [B, R]);
      * ``mrc_kl``: the same against the detector's class distribution (``region_labels`` float [B, R, C], or the
        masked rows [M, C]);
      * ``itm``: image-text matching on the pooled [CLS] (``itm_label`` [B], 1 = the text matches the image);
      * ``wra``: word-region alignment on the same batch (``itm_label`` and ``wra_weight`` [], its loss weight):
        the optimal-transport distance between the pair's words and regions, no parameters.
      * ``itc``: image-text contrastive learning (ALBEF section 3.2) on the unimodal [CLS] of the caption alone and
        of ``[CLS] [SEP]`` + the regions alone (``itc_content`` [B], the captions' content ids; equal content =
        positives), InfoNCE both ways over the global batch; it reads no joint pass, so a step of ITC alone runs
        only its two unimodal passes (:attr:`Objective.reads_joint`).
    ``mrc`` and ``mrc_kl`` share the ``mrc`` head, which exists when ``config.num_region_classes`` > 0. Masked
    regions' features are zeroed by the model (:meth:`VLBertModel.with_region_features`): give them as they are.

    Multi-process training draws one objective per step for every rank, so the heads of the other objectives
    get no gradient (nor does the pooler, which only ITM reads). DDP needs every parameter in every backward: while
    gradients are on, the idle heads are declared in ``unused_parameters``; the trainer enters them into the backward
    with weight zero under DDP and drops their gradients, so the optimizer skips them exactly as without DDP.
    """

    config_class = VLBertConfig
    base_model_prefix = "bert"
    input_names = VL_INPUT_NAMES
    modality = "vl"

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.bert = VLBertModel(config)
        self.build_units(config)  # every registered vision-language unit (vlbert.objectives.OBJECTIVES)
        self.init_weights()

    def forward(
        self,
        inputs: VLInputs | torch.Tensor | None = None,
        /,
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        **labels,
    ) -> PreTrainingOutput:
        """Run the encoder and every objective whose labels are given.

        ``inputs``: a :class:`~vlbert.models.inputs.VLInputs` or its fields as keywords (:meth:`VLBertModel.forward`;
        masked regions' features are zeroed there, pixels hidden by the backbone); ``labels``: the keys of
        :attr:`label_names` (e.g. ``labels`` for MLM with its ``masked_lm_positions``, ``itm_label``; shapes in the
        class docstring). Returns a :class:`PreTrainingOutput` with ``loss`` = the sum of the computed objectives'
        losses and per-objective ``losses``/``metrics``/``counts``; ``seq_relationship_logits`` holds the ITM logits
        [B, 2]. Without any labels (inference), every head that has an output field fills it
        (:meth:`Objective.predict`): ``prediction_logits`` is the MLM over every text position, [B, T, vocab_size],
        as transformers' ``*ForPreTraining`` return every head's logits. A batch whose text a unit rewrites before
        the encoder (ITM's hard negatives) carries no layout: the collator cannot know it; its joint pass and the
        unit's own passes run on the padded batch (:func:`~vlbert.models.bert.run_padded`: no host read of a mask).
        Raises: TypeError for a label no unit reads; ValueError as :meth:`VLBertModel.forward`."""
        inputs = VLInputs.take(inputs, labels)
        # the features as given, before the masked regions' are zeroed: MRFR's targets
        given = self.given_labels(labels, masked_regions=inputs.masked_regions, region_features=inputs.region_features)
        zeroed = self.bert.with_region_features(inputs)
        inputs = self.before_encoder(zeroed, given)
        running = self.running(given)
        keep_hidden = output_hidden_states or any(unit.reads_hidden_states(self.config) for unit in running)
        if running and not (output_hidden_states or output_attentions) and not any(u.reads_joint for u in running):
            # no running unit reads the joint pass (ITC alone: its own unimodal passes): it is not run
            return self.run_units(PreTrainingOutput(), self.encoded(None, inputs), given)
        # text rewritten on the device (ITM's hard negatives): its layout is unknown to the host, the pass runs padded
        with run_padded(self.bert.encoder) if inputs.input_ids is not zeroed.input_ids else contextlib.nullcontext():
            enc = self.bert(inputs, output_hidden_states=keep_hidden, output_attentions=output_attentions)
        out = PreTrainingOutput(
            last_hidden_state=enc.last_hidden_state,
            pooler_output=enc.pooler_output,
            hidden_states=enc.hidden_states if output_hidden_states else None,
            attentions=enc.attentions,
        )
        return self.run_units(out, self.encoded(enc, inputs), given)

    def before_encoder(self, inputs: VLInputs, given: dict) -> VLInputs:
        """``inputs`` as the units that build their examples from the model rewrite them (ITM's hard negatives:
        ``Objective.before_encoder``).

        Raises:
            ValueError: a unit rewrote the text of a batch that carries a layout (which then no longer describes
                it)."""
        rewritten = inputs
        # a unit's own passes (ITM's unimodal [CLS] of hard negatives) carry no layout: padded, no host read of the mask
        with run_padded(self.bert.encoder):
            for unit in self.units:
                if all(given[k] is not None for k in unit.inputs):
                    rewritten = unit.before_encoder(self, rewritten, given)
        if rewritten.input_ids is not inputs.input_ids and inputs.layout is not None:
            raise ValueError(
                "a unit rewrote the text before the encoder (ITM's hard negatives), so the batch's unpadded "
                "layout does not describe it; such batches carry no layout"
            )
        return rewritten

    def encoded(self, enc: EncoderOutput | None, inputs: VLInputs) -> Encoded:
        """What the units' losses read of the encoder pass ``enc`` over ``inputs``: text and region states
        split at T, the pooled [CLS], both masks (all real where not given), the hidden states, the tied MLM
        decoder weight and ``inputs`` themselves. ``enc`` None (the joint pass skipped): no joint states."""
        t = inputs.input_ids.shape[1]
        return Encoded(
            self,
            enc.last_hidden_state[:, :t] if enc is not None else None,
            enc.last_hidden_state[:, t:] if enc is not None else None,
            enc.pooler_output if enc is not None else None,
            inputs.text_mask,
            inputs.regions_mask,
            enc.hidden_states if enc is not None else None,
            self.bert.embeddings.word_embeddings.weight,
            inputs,
        )


__all__ = ["VLBertModel", "VLBertForPreTraining", "SingleStream", "TwoStream", "ENCODERS"]
