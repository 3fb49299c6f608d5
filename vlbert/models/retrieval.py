"""Image-text retrieval on the VL encoder: a contrastive shortlist re-ranked by the ITM cross-encoder."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vlbert.config import VLBertConfig
from vlbert.layers.losses import classification_loss
from vlbert.layers.sampling import draw_by_similarity
from vlbert.layers.unpadded import UnpaddedLayout
from vlbert.models.bert import run_padded
from vlbert.models.outputs import ObjectiveOutput
from vlbert.models.pretrained import PreTrainedModel
from vlbert.models.vl import VLBertModel


@dataclass
class RetrievalOutput(ObjectiveOutput):
    """``scores``: float [B] cross-encoder match scores of the given pairs (ITM logit margin)."""

    scores: torch.Tensor | None = None


def hard_negatives(
    logits: torch.Tensor, same: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One hard negative text per image and one hard negative image per text, drawn in proportion to the
    contrastive similarity (ALBEF ``model_retrieval.py``: ``weights_i2t`` = each image's softmax over the texts,
    ``weights_t2i`` = each text's softmax over the images), never from the same group.

    Args:
        logits: float [B, B], text i x image j similarity / temperature.
        same: bool [B, B], True where text i and image j belong to the same group (never each other's negatives).
    Returns:
        (int64 [B]: for image i, the index of its negative text; int64 [B]: for text i, its negative image).
    Drawn by :func:`~vlbert.layers.sampling.draw_by_similarity` (the one sampler, which ITM's hard negatives use
    too), from uniform numbers of ``generator``.
    """
    b = logits.shape[0]
    uniforms = torch.rand(2, b, generator=generator, device=logits.device)
    return draw_by_similarity(logits.T, same.T, uniforms[0]), draw_by_similarity(logits, same, uniforms[1])


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

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.bert = VLBertModel(config)
        self.itm = nn.Linear(config.hidden_size, 2)
        self.text_proj = nn.Linear(config.hidden_size, config.projection_dim)
        self.image_proj = nn.Linear(config.hidden_size, config.projection_dim)
        self.init_weights()
        self.log_temperature = nn.Parameter(torch.tensor(0.07).log())

    def embed_text(
        self, input_ids, token_type_ids=None, attention_mask=None, layout: UnpaddedLayout | None = None
    ) -> torch.Tensor:
        """Args: text [B, T]; ``layout``: optionally the text mask's unpadded layout (:meth:`VLBertModel.forward`,
        no host sync). Returns float [B, P], unit length."""
        enc = self.bert(input_ids, token_type_ids, attention_mask, layout=layout)
        return F.normalize(self.text_proj(enc.last_hidden_state[:, 0]).float(), dim=-1)

    def embed_image(
        self,
        region_features=None,
        region_boxes=None,
        region_mask=None,
        *,
        cls_sep: tuple[int, int] | torch.Tensor,
        images=None,
        image_sizes=None,
        layout: UnpaddedLayout | None = None,
    ) -> torch.Tensor:
        """Args: regions as :class:`VLBertModel` (``region_features``, or for a model with a visual backbone
        ``images`` float [B, 3, H, W] and ``image_sizes`` int64 [B, 2] under ``region_boxes``); cls_sep: the
        tokenizer's ([CLS], [SEP]) ids, two ints or an int64 [2] tensor on the model's device (the collator's
        ``cls_sep_ids``: never read back); ``layout``: optionally the unpadded layout of ``[CLS] [SEP]`` + regions
        ([B, 2 + R]). Returns float [B, P], unit length."""
        b, device = region_boxes.shape[0], region_boxes.device
        if torch.is_tensor(cls_sep):
            ids = cls_sep.to(device, non_blocking=True).expand(b, 2)
        else:  # made on the device (a host tensor would be a copy the host waits for)
            ids = torch.full((b, 2), cls_sep[1], dtype=torch.long, device=device)
            ids[:, 0] = cls_sep[0]
        enc = self.bert(
            ids,
            None,
            None,
            region_features,
            region_boxes,
            region_mask,
            images=images,
            image_sizes=image_sizes,
            layout=layout,
        )
        return F.normalize(self.image_proj(enc.last_hidden_state[:, 0]).float(), dim=-1)

    def match_scores(
        self,
        input_ids,
        token_type_ids,
        attention_mask,
        region_features=None,
        region_boxes=None,
        region_mask=None,
        images=None,
        image_sizes=None,
    ) -> torch.Tensor:
        """Cross-encoder score of each (text, image) pair: ITM logit margin, float [B]. Regions as
        :meth:`embed_image`."""
        logits = self.itm(
            self.bert(
                input_ids,
                token_type_ids,
                attention_mask,
                region_features,
                region_boxes,
                region_mask,
                images=images,
                image_sizes=image_sizes,
            ).pooler_output
        ).float()
        return logits[:, 1] - logits[:, 0]

    def forward(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        region_features=None,
        region_boxes=None,
        region_mask=None,
        group_ids=None,
        cls_sep_ids=None,
        images=None,
        image_sizes=None,
        text_layout: UnpaddedLayout | None = None,
        image_layout: UnpaddedLayout | None = None,
    ) -> RetrievalOutput:
        """Without ``group_ids``: the cross-encoder scores of the given pairs. With ``group_ids`` (int64 [B]; equal
        ids = interchangeable texts/images, never each other's negatives) and ``cls_sep_ids`` (int64 [2]): the
        training losses ``itc`` and ``itm`` (with ``itc_accuracy``/``itm_accuracy``).

        ``text_layout`` and ``image_layout``: the collator's unpadded layouts of the text pass and of the image pass
        (:class:`~vlbert.data.retrieval.RetrievalCollator`), so that neither reads a mask on the device. The ITM
        pass pairs texts and images drawn on the device (the hard negatives), whose layout the host cannot know
        without waiting: it runs on the padded batch with its masks (a padded attention kernel), so the step never
        waits on the host (:meth:`itm_on_hard_negatives`).

        ``images`` (float [B, 3, H, W]) and ``image_sizes`` (int64 [B, 2]), for a model with a visual backbone:
        the region features are computed from them once (:meth:`VLBertModel.extract_regions`, under
        ``region_boxes``) and shared by the contrastive pass and the ITM pairs, so both losses train the backbone.
        Raises ValueError: training on fewer than 2 pairs."""
        if images is not None:
            region_features = self.bert.extract_regions(images, region_boxes, region_mask, image_sizes)
        if group_ids is None:
            scores = self.match_scores(
                input_ids, token_type_ids, attention_mask, region_features, region_boxes, region_mask
            )
            return RetrievalOutput(scores=scores)
        b = input_ids.shape[0]
        if b < 2:
            raise ValueError("retrieval training needs at least 2 pairs per batch (negatives come from the batch)")
        t = self.embed_text(input_ids, token_type_ids, attention_mask, text_layout)
        v = self.embed_image(region_features, region_boxes, region_mask, cls_sep=cls_sep_ids, layout=image_layout)
        same = group_ids[:, None] == group_ids[None, :]
        logits = t @ v.T / self.log_temperature.exp()
        target = same.float() / same.float().sum(1, keepdim=True)
        itc = (
            torch.sum(-target * F.log_softmax(logits, 1), 1).mean()
            + torch.sum(-target * F.log_softmax(logits.T, 1), 1).mean()
        ) / 2
        out = RetrievalOutput()
        with torch.no_grad():
            itc_acc = same.gather(1, logits.argmax(1, keepdim=True)).float().mean()
            negatives = hard_negatives(logits, same)
        out.add("itc", itc, "itc_accuracy", itc_acc, b)
        pairs = (input_ids, token_type_ids, attention_mask, region_features, region_boxes, region_mask)
        out.add("itm", *self.itm_on_hard_negatives(pairs, *negatives))
        out.add_unused(*self.idle_modules())
        return out

    def idle_modules(self) -> list[nn.Module]:
        """The submodules a training forward leaves without gradient, declared here once (the trainer applies them
        under DDP): the region pathway's masked-region modules (no region is masked in retrieval)."""
        return self.bert.idle_modules()

    def itm_on_hard_negatives(self, pairs: tuple, neg_text: torch.Tensor, neg_image: torch.Tensor) -> tuple:
        """ITM over the B positive ``pairs`` (input_ids, token_type_ids, attention_mask, region_features,
        region_boxes, region_mask, as :meth:`forward`), each image with its hard negative text ``neg_text`` [B] and
        each text with its hard negative image ``neg_image`` [B] (:func:`hard_negatives`), on the padded batch
        (:func:`~vlbert.models.bert.run_padded`). Returns (loss, "itm_accuracy", accuracy, count) for
        ``ObjectiveOutput.add``."""
        input_ids, token_type_ids, attention_mask, region_features, region_boxes, region_mask = pairs
        b = input_ids.shape[0]
        idx = torch.arange(b, device=input_ids.device)
        text_rows = torch.cat([idx, neg_text, idx])
        image_rows = torch.cat([idx, idx, neg_image])
        tt = None if token_type_ids is None else token_type_ids[text_rows]
        am = None if attention_mask is None else attention_mask[text_rows]
        with run_padded(self.bert.encoder):
            logits_itm = self.itm(
                self.bert(
                    input_ids[text_rows],
                    tt,
                    am,
                    region_features[image_rows],
                    region_boxes[image_rows],
                    None if region_mask is None else region_mask[image_rows],
                ).pooler_output
            ).float()
        labels = (torch.arange(3 * b, device=logits_itm.device) < b).long()  # b matches, then 2b non-matches
        loss, acc, n = classification_loss(logits_itm, labels)
        return loss, "itm_accuracy", acc, n


__all__ = ["VLBertForImageTextRetrieval", "RetrievalOutput", "hard_negatives"]
