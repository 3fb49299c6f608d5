"""Single-stream vision-language BERT: text wordpieces and detector regions in one Transformer encoder.

Source: UNITER (Chen et al. 2020, section 3.1 and 3.2) for region embeddings (projected RoI feature + projected
7-d location [x1, y1, x2, y2, w, h, w*h], each layer-normed, plus a segment embedding) and the pretraining
objectives (MLM conditioned on the image, masked region feature regression and KL classification, image-text
matching, one modality masked at a time); VisualBERT (Li et al. 2019) for initialising the shared encoder from
BERT. Regions carry no position ids, so the encoder treats them as an unordered set.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vlbert.config import VLBertConfig
from vlbert.models.bert import (BertEmbeddings, BertEncoder, BertModel, BertPooler, Dropout, MaskedLMHead, activation,
                                classification_loss, masked_lm_loss, upcast)
from vlbert.models.outputs import EncoderOutput, ObjectiveOutput, PreTrainingOutput
from vlbert.models.pretrained import PreTrainedModel

#: token_type id of regions: BERT's segment B embedding, as UNITER (text of a VL pair is segment A).
VISUAL_TOKEN_TYPE = 1


def region_location_features(boxes: torch.Tensor) -> torch.Tensor:
    """The 7-d location feature of each region (UNITER section 3.1).

    Args:
        boxes: float [..., 4] = (x1, y1, x2, y2), normalised to [0, 1] by image width and height.
    Returns:
        float [..., 7] = (x1, y1, x2, y2, w, h, w * h) with w = x2 - x1, h = y2 - y1 (w * h is the area fraction).
    """
    x1, y1, x2, y2 = boxes.unbind(-1)
    w, h = x2 - x1, y2 - y1
    return torch.stack([x1, y1, x2, y2, w, h, w * h], dim=-1)


class RegionEmbeddings(nn.Module):
    """Region embeddings: LN(W_f f) + LN(W_l loc7(box)) + segment embedding, then LayerNorm and dropout.

    Source: UNITER ``UniterImageEmbeddings``. The segment embedding is row ``VISUAL_TOKEN_TYPE`` of the text
    embeddings' token-type table (shared, passed to :meth:`forward`).
    """

    def __init__(self, config: VLBertConfig):
        super().__init__()
        self.feature_proj = nn.Linear(config.region_feature_dim, config.hidden_size)
        self.feature_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.location_proj = nn.Linear(config.region_location_dim, config.hidden_size)
        self.location_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, region_features: torch.Tensor, region_boxes: torch.Tensor,
                segment_embedding: torch.Tensor) -> torch.Tensor:
        """Args: region_features [B, R, D] (float16 is cast to the layer's dtype here); region_boxes float
        [B, R, 4] normalised xyxy; segment_embedding [H]. Returns float [B, R, H]."""
        dtype = self.feature_proj.weight.dtype
        x = self.feature_norm(self.feature_proj(region_features.to(dtype)))
        x = x + self.location_norm(self.location_proj(region_location_features(region_boxes.to(dtype))))
        return self.dropout(self.norm(x + segment_embedding))


class VLBertModel(BertModel):
    """BERT over [text ; regions]: text embeddings and :class:`RegionEmbeddings` concatenated along the sequence,
    one encoder, a joint attention mask. ``last_hidden_state`` is [B, T + R, H], text positions first; the pooler
    reads the text's [CLS].

    Initialise the shared encoder from any BERT checkpoint with ``VLBertModel.from_pretrained(dir,
    region_feature_dim=...)``: the region embeddings are then newly initialised (listed in ``loading_info``).
    """

    config_class = VLBertConfig

    def __init__(self, config: VLBertConfig, add_pooling_layer: bool = True):
        PreTrainedModel.__init__(self, config)
        self.embeddings = BertEmbeddings(config)
        self.region_embeddings = RegionEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

    def check_region_inputs(self, input_ids: torch.Tensor, region_features: torch.Tensor,
                            region_boxes: torch.Tensor, region_mask: torch.Tensor | None) -> None:
        """Raise ``ValueError`` for region inputs of the wrong shape (shape checks only: no device sync)."""
        b = input_ids.shape[0]
        d = self.config.region_feature_dim
        if region_features.dim() != 3 or region_features.shape[0] != b or region_features.shape[2] != d:
            raise ValueError(
                f"region_features must be [batch={b}, regions, region_feature_dim={d}], got "
                f"{tuple(region_features.shape)}; the detector's feature size must equal config.region_feature_dim")
        r = region_features.shape[1]
        if r == 0:
            raise ValueError("region_features has zero regions; every image needs at least one region "
                             "(the whole-image box is always a valid region)")
        if region_boxes.shape != (b, r, 4):
            raise ValueError(f"region_boxes must be [{b}, {r}, 4] normalised (x1, y1, x2, y2), got "
                             f"{tuple(region_boxes.shape)}")
        if region_mask is not None and region_mask.shape != (b, r):
            raise ValueError(f"region_mask must be [{b}, {r}], got {tuple(region_mask.shape)}")

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, region_features: torch.Tensor | None = None,
                region_boxes: torch.Tensor | None = None, region_mask: torch.Tensor | None = None,
                output_hidden_states: bool = False) -> EncoderOutput:
        """Encode text and regions jointly.

        Args:
            input_ids, token_type_ids, attention_mask: text, [B, T] (as :meth:`BertModel.forward`).
            region_features: float [B, R, region_feature_dim] RoI features (float16 accepted).
            region_boxes: float [B, R, 4], (x1, y1, x2, y2) normalised to [0, 1] by image width/height.
            region_mask: [B, R], 1 = real region, 0 = padding (default all 1).
            output_hidden_states: also return per-layer hidden states over all T + R positions.
        Returns:
            :class:`EncoderOutput`, last_hidden_state [B, T + R, H] (text rows first), pooler_output [B, H].
            Without regions this is exactly :class:`BertModel`.
        Raises:
            ValueError: text input errors (see BertModel), feature size other than config.region_feature_dim,
                zero regions, or mismatched box/mask shapes.
        """
        if region_features is None:
            return super().forward(input_ids, token_type_ids, attention_mask, output_hidden_states)
        self.check_text_inputs(input_ids, token_type_ids, attention_mask)
        if region_boxes is None:
            raise ValueError("region_boxes are required with region_features")
        self.check_region_inputs(input_ids, region_features, region_boxes, region_mask)
        text = self.embeddings(input_ids, token_type_ids)
        segment = self.embeddings.token_type_embeddings.weight[VISUAL_TOKEN_TYPE]
        regions = self.region_embeddings(region_features, region_boxes, segment)
        x = torch.cat([text, regions.to(text.dtype)], dim=1)
        b, t, r = input_ids.shape[0], input_ids.shape[1], region_features.shape[1]
        text_mask = attention_mask if attention_mask is not None else input_ids.new_ones(b, t)
        reg_mask = region_mask if region_mask is not None else input_ids.new_ones(b, r)
        mask = torch.cat([text_mask.to(torch.long), reg_mask.to(torch.long)], dim=1)
        last, hidden_states = self.encoder(x, mask, output_hidden_states)
        pooled = self.pooler(last) if self.pooler is not None else None
        return EncoderOutput(last_hidden_state=last, pooler_output=pooled, hidden_states=hidden_states)


class RegionHead(nn.Module):
    """dense + activation + LayerNorm + linear to ``out_dim``: the MRFR (features) and MRC (classes) heads."""

    def __init__(self, config: VLBertConfig, out_dim: int):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, out_dim)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Args: float [N, H]. Returns float [N, out_dim]."""
        return self.decoder(self.norm(self.act(self.dense(hidden))))


class VLBertForPreTraining(PreTrainedModel):
    """Vision-language pretraining heads over :class:`VLBertModel` (UNITER section 3.2).

    Objectives, each computed only where its labels are given (one task per batch, UNITER-style):
      * ``mlm``: masked LM on text conditioned on the regions (``labels`` [B, T], -100 = not masked);
      * ``mrfr``: masked region feature regression, MSE between the head's output and the original RoI
        feature at masked regions (``masked_regions`` bool [B, R], ``region_targets`` float [B, R, D]);
      * ``mrc``: masked region classification against the detector's class distribution (``masked_regions``
        and ``region_labels`` float [B, R, C], rows summing to 1): KL divergence (MRC-kl, ``config.mrc_loss =
        "kl"``) or cross-entropy with the detector's top class as label (MRC, ``"ce"``); ``mrc_accuracy``
        compares argmaxes;
      * ``itm``: image-text matching on the pooled [CLS], ``itm_label`` [B] (1 = the text matches the image,
        0 = a caption of another image), as UNITER.
    Masked regions' features must already be zeroed in the input (the collator does this).
    """

    config_class = VLBertConfig
    base_model_prefix = "bert"
    objectives = ("mlm", "mrfr", "mrc", "itm")

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.bert = VLBertModel(config)
        self.masked_lm = MaskedLMHead(config)
        self.itm = nn.Linear(config.hidden_size, 2)
        self.mrfr = RegionHead(config, config.region_feature_dim)
        self.mrc = RegionHead(config, config.num_region_classes) if config.num_region_classes else None
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, region_features=None,
                region_boxes=None, region_mask=None, labels=None, masked_regions=None, region_targets=None,
                region_labels=None, itm_label=None, output_hidden_states: bool = False) -> PreTrainingOutput:
        """Run the encoder and whichever objectives have labels. Shapes as the class docstring; returns a
        :class:`PreTrainingOutput` with ``loss`` = sum of the computed objectives' losses and per-objective
        ``losses``/``metrics``/``counts`` (mlm, mrfr, mrc, itm)."""
        enc = self.bert(input_ids, token_type_ids, attention_mask, region_features, region_boxes, region_mask,
                        output_hidden_states)
        out = PreTrainingOutput(last_hidden_state=enc.last_hidden_state, pooler_output=enc.pooler_output,
                                hidden_states=enc.hidden_states)
        t = input_ids.shape[1]
        text_hidden, region_hidden = enc.last_hidden_state[:, :t], enc.last_hidden_state[:, t:]
        if labels is not None:
            loss, out.prediction_logits, acc, n = masked_lm_loss(
                self.masked_lm, self.bert.embeddings.word_embeddings.weight, text_hidden, labels)
            out.add("mlm", loss, "mlm_accuracy", acc, n)
        if masked_regions is not None and (region_targets is not None or region_labels is not None):
            selected = region_hidden[masked_regions.bool()]
            n = selected.shape[0]
            if region_targets is not None:
                pred = upcast(self.mrfr(selected))
                target = region_targets[masked_regions.bool()].to(pred.dtype)
                loss = F.mse_loss(pred, target) if n else pred.sum() * 0.0
                out.add("mrfr", loss, "mrfr_mse", loss.detach(), n)
            if region_labels is not None and self.mrc is not None:
                logits = upcast(self.mrc(selected))
                target = region_labels[masked_regions.bool()].to(logits.dtype)
                if n and self.config.mrc_loss == "ce":
                    loss = F.cross_entropy(logits, target.argmax(-1))
                    with torch.no_grad():
                        acc = (logits.argmax(-1) == target.argmax(-1)).float().mean()
                elif n:
                    loss = F.kl_div(F.log_softmax(logits, -1), target, reduction="batchmean")
                    with torch.no_grad():
                        acc = (logits.argmax(-1) == target.argmax(-1)).float().mean()
                else:
                    loss, acc = logits.sum() * 0.0, logits.sum().detach() * 0.0
                out.add("mrc", loss, "mrc_accuracy", acc, n)
        if itm_label is not None:
            logits = self.itm(enc.pooler_output)
            out.seq_relationship_logits = logits
            loss, acc, n = classification_loss(logits, itm_label)
            out.add("itm", loss, "itm_accuracy", acc, n)
        return out


@dataclass
class VQAOutput(ObjectiveOutput):
    """``logits``: float [B, num_labels], one score per answer of the answer vocabulary."""

    logits: torch.Tensor | None = None


class VLBertForVQA(PreTrainedModel):
    """VQA as multi-label classification over an answer vocabulary from the joint [CLS] (UNITER section 4;
    Anderson et al. 2018 section 3.3): pooled output -> Linear(H, 2H) -> GELU -> LayerNorm -> Linear(2H, A).

    Trained with binary cross-entropy against soft scores (min(#annotators / 3, 1) per answer; see
    :func:`vlbert.evaluation.vqa.answer_targets`), summed over answers and averaged over questions, as BUTD.
    ``config.num_labels`` is the answer vocabulary size A.
    """

    config_class = VLBertConfig
    base_model_prefix = "bert"
    objectives = ("vqa",)

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.bert = VLBertModel(config)
        h = config.hidden_size
        self.vqa_head = nn.Sequential(nn.Linear(h, 2 * h), nn.GELU(), nn.LayerNorm(2 * h, eps=config.layer_norm_eps),
                                      nn.Linear(2 * h, config.num_labels))
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


@dataclass
class RetrievalOutput(ObjectiveOutput):
    """``scores``: float [B] cross-encoder match scores of the given pairs (ITM logit margin)."""

    scores: torch.Tensor | None = None


class VLBertForImageTextRetrieval(PreTrainedModel):
    """Image-text retrieval: a cross-encoder ITM head re-ranks a shortlist from a contrastive (dual-encoder)
    stage that shares the same encoder (ALBEF, Li et al. 2021, section 3; UNITER section 4 for ITM fine-tuning
    with hard negatives).

    * :meth:`embed_text`: text alone through the encoder, [CLS] -> ``text_proj`` -> L2-normalised [B, P].
    * :meth:`embed_image`: ``[CLS] [SEP]`` + regions through the encoder, [CLS] -> ``image_proj`` -> [B, P].
    * :meth:`match_scores`: the joint pass, ITM logit(match) - logit(no match), [B].
    Training (:meth:`forward` with ``group_ids``): ITC over the batch (InfoNCE both ways, temperature learned,
    items of the same group are all positives) + ITM on each positive pair, one hard negative text per image and
    one hard negative image per text, drawn in proportion to their contrastive similarity.
    The ``itm`` head has the pretraining head's name and shape, so a VL-pretrained checkpoint initialises it.
    """

    config_class = VLBertConfig
    base_model_prefix = "bert"
    objectives = ("itc", "itm")

    def __init__(self, config: VLBertConfig, projection_dim: int = 256):
        super().__init__(config)
        self.bert = VLBertModel(config)
        self.itm = nn.Linear(config.hidden_size, 2)
        self.text_proj = nn.Linear(config.hidden_size, projection_dim)
        self.image_proj = nn.Linear(config.hidden_size, projection_dim)
        self.init_weights()
        self.log_temperature = nn.Parameter(torch.tensor(0.07).log())

    def embed_text(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        """Args: text [B, T]. Returns float [B, P], unit length."""
        enc = self.bert(input_ids, token_type_ids, attention_mask)
        return F.normalize(self.text_proj(enc.last_hidden_state[:, 0]).float(), dim=-1)

    def embed_image(self, region_features, region_boxes, region_mask, cls_sep: tuple[int, int]) -> torch.Tensor:
        """Args: regions as :class:`VLBertModel`; cls_sep: the tokenizer's ([CLS], [SEP]) ids. Returns [B, P]."""
        b = region_features.shape[0]
        ids = torch.tensor(cls_sep, device=region_features.device).expand(b, 2)
        enc = self.bert(ids, None, None, region_features, region_boxes, region_mask)
        return F.normalize(self.image_proj(enc.last_hidden_state[:, 0]).float(), dim=-1)

    def match_scores(self, input_ids, token_type_ids, attention_mask, region_features, region_boxes,
                     region_mask) -> torch.Tensor:
        """Cross-encoder score of each (text, image) pair: ITM logit margin, float [B]."""
        logits = self.itm(self.bert(input_ids, token_type_ids, attention_mask, region_features, region_boxes,
                                    region_mask).pooler_output).float()
        return logits[:, 1] - logits[:, 0]

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, region_features=None, region_boxes=None,
                region_mask=None, group_ids=None, cls_sep_ids=None) -> RetrievalOutput:
        """Without ``group_ids``: the cross-encoder scores of the given pairs. With ``group_ids`` (int64 [B]; equal
        ids = interchangeable texts/images, never each other's negatives) and ``cls_sep_ids`` (int64 [2]): the
        training losses ``itc`` and ``itm`` (with ``itc_accuracy``/``itm_accuracy``)."""
        if group_ids is None:
            return RetrievalOutput(scores=self.match_scores(input_ids, token_type_ids, attention_mask,
                                                            region_features, region_boxes, region_mask))
        b = input_ids.shape[0]
        if b < 2:
            raise ValueError("retrieval training needs at least 2 pairs per batch (negatives come from the batch)")
        t = self.embed_text(input_ids, token_type_ids, attention_mask)
        v = self.embed_image(region_features, region_boxes, region_mask, tuple(cls_sep_ids.tolist()))
        same = group_ids[:, None] == group_ids[None, :]
        logits = t @ v.T / self.log_temperature.exp()
        target = same.float() / same.float().sum(1, keepdim=True)
        itc = (torch.sum(-target * F.log_softmax(logits, 1), 1).mean()
               + torch.sum(-target * F.log_softmax(logits.T, 1), 1).mean()) / 2
        out = RetrievalOutput()
        with torch.no_grad():
            itc_acc = same[torch.arange(b), logits.argmax(1)].float().mean()
            # Other groups in proportion to similarity; the epsilon keeps a batch of one group drawable.
            weights = logits.softmax(1).masked_fill(same, 0) + 1e-8
            neg_text = torch.multinomial(weights.T, 1).squeeze(1)   # for image i: a text of another group
            neg_image = torch.multinomial(weights, 1).squeeze(1)    # for text i: an image of another group
        out.add("itc", itc, "itc_accuracy", itc_acc, b)
        idx = torch.arange(b, device=input_ids.device)
        text_rows = torch.cat([idx, neg_text, idx])
        image_rows = torch.cat([idx, idx, neg_image])
        tt = None if token_type_ids is None else token_type_ids[text_rows]
        am = None if attention_mask is None else attention_mask[text_rows]
        logits_itm = self.itm(self.bert(input_ids[text_rows], tt, am, region_features[image_rows],
                                        region_boxes[image_rows], None if region_mask is None
                                        else region_mask[image_rows]).pooler_output).float()
        labels = torch.cat([torch.ones(b), torch.zeros(2 * b)]).long().to(logits_itm.device)
        loss, acc, n = classification_loss(logits_itm, labels)
        out.add("itm", loss, "itm_accuracy", acc, n)
        return out


__all__ = ["VLBertModel", "VLBertForPreTraining", "VLBertForVQA", "VQAOutput", "VLBertForImageTextRetrieval",
           "RetrievalOutput", "RegionEmbeddings", "RegionHead", "region_location_features",
           "VISUAL_TOKEN_TYPE"]
