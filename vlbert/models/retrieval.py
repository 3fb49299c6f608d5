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
from vlbert.models.inputs import VL_INPUT_NAMES, VLInputs
from vlbert.models.outputs import ObjectiveOutput
from vlbert.models.pretrained import PreTrainedModel
from vlbert.models.vl import VLBertModel
from vlbert.objectives.contrastive import TEMPERATURE_RANGE


def _log_clamped(temperature: torch.Tensor) -> torch.Tensor:
    return temperature.float().clamp(*TEMPERATURE_RANGE).log()


#: A VL-pretrained checkpoint's ITC head (:class:`~vlbert.objectives.contrastive.ContrastiveHead`, ``itc.*``) as
#: this model's shortlist: checkpoint key -> (own key, conversion or None). The temperature is kept as its log here,
#: of the value ITC would use (clamped to ALBEF's range, as ITC clamps it before each use).
FROM_PRETRAINING = {
    "itc.text_proj.weight": ("text_proj.weight", None),
    "itc.text_proj.bias": ("text_proj.bias", None),
    "itc.image_proj.weight": ("image_proj.weight", None),
    "itc.image_proj.bias": ("image_proj.bias", None),
    "itc.temperature": ("log_temperature", _log_clamped),
}


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


def contrastive_loss(logits: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
    """InfoNCE both ways with every item of a group a positive (ALBEF ``model_retrieval.py``: the soft targets of
    ``sim_targets`` over the group): the mean of the text -> image and image -> text cross-entropies.

    Args:
        logits: float [B, B], text i x image j similarity / temperature.
        same: bool [B, B], True where text i and image j belong to the same group.
    Returns: float [] (the loss)."""
    target = same.float() / same.float().sum(1, keepdim=True)
    return (
        torch.sum(-target * F.log_softmax(logits, 1), 1).mean()
        + torch.sum(-target * F.log_softmax(logits.T, 1), 1).mean()
    ) / 2


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
    The ``itm`` head has the pretraining head's name and shape, so a VL-pretrained checkpoint initialises it; its
    ``itc`` head, where it was pretrained with ITC, initialises the shortlist (:data:`FROM_PRETRAINING`).
    """

    config_class = VLBertConfig
    base_model_prefix = "bert"
    input_names = VL_INPUT_NAMES
    objectives = ("itc", "itm")

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.bert = VLBertModel(config)
        self.itm = nn.Linear(config.hidden_size, 2)
        self.text_proj = nn.Linear(config.hidden_size, config.projection_dim)
        self.image_proj = nn.Linear(config.hidden_size, config.projection_dim)
        self.init_weights()
        self.log_temperature = nn.Parameter(torch.tensor(0.07).log())

    def embed_text(self, inputs: VLInputs | torch.Tensor | None = None, /, **fields) -> torch.Tensor:
        """The text alone through the encoder: ``inputs`` a :class:`~vlbert.models.inputs.VLInputs` of text [B, T]
        or its fields as keywords (``layout``: the text mask's unpadded layout, no host sync). Returns float [B, P],
        unit length."""
        enc = self.bert(VLInputs.take(inputs, fields))
        return F.normalize(self.text_proj(enc.last_hidden_state[:, 0]).float(), dim=-1)

    def embed_image(
        self, inputs: VLInputs | None = None, /, *, cls_sep: tuple[int, int] | torch.Tensor, **fields
    ) -> torch.Tensor:
        """``[CLS] [SEP]`` and the regions through the encoder: ``inputs`` a :class:`~vlbert.models.inputs.VLInputs`
        of regions (no text; ``region_features``, or for a model with a visual backbone ``images`` and
        ``image_sizes`` under ``region_boxes``; ``layout``: the unpadded layout of ``[CLS] [SEP]`` + regions,
        [B, 2 + R]) or its fields as keywords; cls_sep: the tokenizer's ([CLS], [SEP]) ids, two ints or an int64
        [2] tensor on the model's device (the collator's ``cls_sep_ids``: never read back).
        Returns float [B, P], unit length."""
        inputs = VLInputs.take(inputs, fields)
        b, device = inputs.region_boxes.shape[0], inputs.region_boxes.device
        if torch.is_tensor(cls_sep):
            ids = cls_sep.to(device, non_blocking=True).expand(b, 2)
        else:  # made on the device (a host tensor would be a copy the host waits for)
            ids = torch.full((b, 2), cls_sep[1], dtype=torch.long, device=device)
            ids[:, 0] = cls_sep[0]
        enc = self.bert(inputs.replace(input_ids=ids, token_type_ids=None, attention_mask=None))
        return F.normalize(self.image_proj(enc.last_hidden_state[:, 0]).float(), dim=-1)

    def match_scores(self, inputs: VLInputs | torch.Tensor | None = None, /, **fields) -> torch.Tensor:
        """Cross-encoder score of each (text, image) pair of ``inputs`` (a :class:`~vlbert.models.inputs.VLInputs`
        or its fields as keywords; regions as :meth:`embed_image`): ITM logit margin, float [B]."""
        logits = self.itm(self.bert(VLInputs.take(inputs, fields)).pooler_output).float()
        return logits[:, 1] - logits[:, 0]

    def forward(
        self,
        inputs: VLInputs | torch.Tensor | None = None,
        /,
        *,
        group_ids: torch.Tensor | None = None,
        cls_sep_ids: torch.Tensor | None = None,
        text_layout: UnpaddedLayout | None = None,
        image_layout: UnpaddedLayout | None = None,
        **fields,
    ) -> RetrievalOutput:
        """Without ``group_ids``: the cross-encoder scores of the given pairs (``inputs``: a
        :class:`~vlbert.models.inputs.VLInputs` or its fields as keywords). With ``group_ids`` (int64 [B]; equal
        ids = interchangeable texts/images, never each other's negatives) and ``cls_sep_ids`` (int64 [2]): the
        training losses ``itc`` and ``itm`` (with ``itc_accuracy``/``itm_accuracy``).

        ``text_layout`` and ``image_layout``: the collator's unpadded layouts of the text pass and of the image pass
        (:class:`~vlbert.processing.collator.RetrievalCollator`), so that neither reads a mask on the device. The ITM
        pass pairs texts and images drawn on the device (the hard negatives), whose layout the host cannot know
        without waiting: it runs on the padded batch with its masks (a padded attention kernel), so the step never
        waits on the host (:meth:`itm_on_hard_negatives`). Pixels (a model with a visual backbone) become features
        once, shared by the contrastive pass and the ITM pairs, so both losses train the backbone.
        Raises TypeError: a keyword that is not an input; ValueError: training on fewer than 2 pairs."""
        inputs = VLInputs.take(inputs, fields)
        if fields:
            raise TypeError(f"{type(self).__name__}.forward got unknown keyword(s) {sorted(fields)}")
        inputs = self.bert.with_region_features(inputs)
        if group_ids is None:
            return RetrievalOutput(scores=self.match_scores(inputs))
        b = inputs.input_ids.shape[0]
        if b < 2:
            raise ValueError("retrieval training needs at least 2 pairs per batch (negatives come from the batch)")
        t = self.embed_text(inputs.text_only().replace(layout=text_layout))
        image = inputs.replace(input_ids=None, token_type_ids=None, attention_mask=None, layout=image_layout)
        v = self.embed_image(image, cls_sep=cls_sep_ids)
        same = group_ids[:, None] == group_ids[None, :]
        logits = t @ v.T / self.log_temperature.exp()
        itc = contrastive_loss(logits, same)
        out = RetrievalOutput()
        with torch.no_grad():
            itc_acc = same.gather(1, logits.argmax(1, keepdim=True)).float().mean()
            negatives = hard_negatives(logits, same)
        out.add("itc", itc, "itc_accuracy", itc_acc, b)
        out.add("itm", *self.itm_on_hard_negatives(inputs, *negatives))
        out.add_unused(*self.idle_modules())
        return out

    def load_converted_state_dict(self, state: dict[str, torch.Tensor], *args, **kwargs):
        """:meth:`PreTrainedModel.load_converted_state_dict` after mapping a VL-pretrained checkpoint's ITC head onto
        the shortlist (:data:`FROM_PRETRAINING`: ``itc.text_proj`` / ``itc.image_proj`` -> ``text_proj`` /
        ``image_proj``, ``itc.temperature`` -> ``log_temperature``), so a model pretrained with ITC
        (:mod:`vlbert.objectives.contrastive`) shortlists with its trained projections: the same unimodal passes
        and projections, hence the ITC similarity's ranking. A key the checkpoint already has under this model's
        own name (a retrieval checkpoint) is kept as it is."""
        state = dict(state)
        for key, (own, convert) in FROM_PRETRAINING.items():
            if key in state and own not in state:
                value = state.pop(key)
                state[own] = convert(value) if convert else value
        return super().load_converted_state_dict(state, *args, **kwargs)

    def idle_modules(self) -> list[nn.Module]:
        """The submodules a training forward leaves without gradient, declared here once (the trainer applies them
        under DDP): the region pathway's masked-region modules (no region is masked in retrieval)."""
        return self.bert.idle_modules()

    def itm_on_hard_negatives(self, pairs: VLInputs, neg_text: torch.Tensor, neg_image: torch.Tensor) -> tuple:
        """ITM over the B positive ``pairs`` (text and region features, as :meth:`forward`), each image with its
        hard negative text ``neg_text`` [B] and each text with its hard negative image ``neg_image`` [B]
        (:func:`hard_negatives`), on the padded batch (:func:`~vlbert.models.bert.run_padded`). Returns (loss,
        "itm_accuracy", accuracy, count) for ``ObjectiveOutput.add``."""
        b = pairs.input_ids.shape[0]
        idx = torch.arange(b, device=pairs.input_ids.device)
        rows = pairs.rows(torch.cat([idx, neg_text, idx]), torch.cat([idx, idx, neg_image]))
        with run_padded(self.bert.encoder):
            logits_itm = self.itm(self.bert(rows).pooler_output).float()
        labels = (torch.arange(3 * b, device=logits_itm.device) < b).long()  # b matches, then 2b non-matches
        loss, acc, n = classification_loss(logits_itm, labels)
        return loss, "itm_accuracy", acc, n


__all__ = ["VLBertForImageTextRetrieval", "RetrievalOutput", "hard_negatives", "contrastive_loss", "FROM_PRETRAINING"]
