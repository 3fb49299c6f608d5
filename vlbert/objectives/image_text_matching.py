"""Image-text matching (UNITER section 3.2): half of the images keep their own caption (label 1), the other
half get a caption of another image whose content differs (label 0); cross-entropy on the pooled [CLS].

Negatives (``data.itm_negatives``): ``random`` (UNITER; the default) draws the other caption uniformly in the
dataset; ``hard`` (ALBEF, Li et al. 2021 section 3.2, applied to pretraining) draws it, for each image, from the
captions of the global batch (every rank's) in proportion to their similarity to the image,
softmax(cos(text, image) / ``temperature``) over the captions of other content. A pretraining model has no
contrastive head, so the similarity is that of the encoder's own unimodal [CLS] vectors (the text alone, the
regions alone after ``[CLS] [SEP]``, as :class:`~vlbert.models.retrieval.VLBertForImageTextRetrieval` embeds
them), computed without gradient before the joint pass.

``itc`` (ALBEF's own draw: ``models/model_pretrain.py`` at salesforce/ALBEF@b9727e4): every item keeps its own
caption, and the batch of b pairs becomes 3b ITM rows, as ALBEF's: the b pairs (label 1), each caption with a
negative image, and each image with a negative caption (label 0), each negative drawn from the global batch in
proportion to softmax(similarity / temperature) of the ``itc`` head (its projections and learned temperature;
ALBEF's ``sim_t2i``, ``sim_i2t``), items of the same content excluded (ALBEF's retrieval fine-tuning excludes equal
``idx``; its pretraining only the pair itself). ALBEF's similarities are those of its ITC step (the momentum model's
batch features as columns); here ITM is a step of its own, so both sides are the model's own embeddings, computed
without gradient. Draws are by each item's own uniform numbers (``itm_draw`` [B, 2]: the image, the caption), so N
processes at batch b draw as one at N x b.

Across processes (``hard`` and ``itc``): every rank's captions (and regions) are gathered padded to the run's bounds,
the collator's ``gather_bounds`` (:class:`~vlbert.utils.GatherBounds`: the per-device batch size, the text length,
the regions), which every rank knows without asking the others (:func:`~vlbert.utils.all_gather_padded`): nothing is
read back to the host; the padded rows (a rank's last, smaller batch) are never drawn. Evaluation (the model in eval
mode) draws from the rank's own batch: the trainer deals the held-out batches round-robin, so ranks run different
numbers of them and a collective would wait forever; each held-out batch is drawn from as one process draws.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from vlbert.layers.losses import classification_loss, upcast
from vlbert.layers.sampling import draw_by_similarity
from vlbert.objectives.base import Encoded, Objective, ObjectiveResult, PrepareContext, item_squares
from vlbert.objectives.contrastive import ImageTextContrastive
from vlbert.utils import GatherBounds, all_gather_padded, process_position

if TYPE_CHECKING:
    from vlbert.models.inputs import VLInputs

NEGATIVES = ("random", "hard", "itc")


def content_id(content: str) -> int:
    """A stable integer for a caption's content key (the same in every process)."""
    return zlib.crc32(content.encode("utf-8")) & 0x7FFFFFFF


class ImageTextMatching(Objective):
    """``itm_label`` int64 [B] (1 = the text belongs to the image). Items carry ``negative_input_ids``, a
    caption of another image with different content (the dataset guarantees it), and ``content_id``. With hard
    negatives the batch keeps every item's own caption and adds ``itm_content`` int64 [B] and ``itm_draw`` float
    [B] (each row's uniform number in [0, 1), from its own seed); the model replaces the texts of the label-0
    rows before encoding (:meth:`before_encoder`), and the collator gives such a batch no unpadded layout. With
    ``itc`` negatives every ``itm_label`` is 1 and ``itm_draw`` is [B, 2]; the model encodes 3B rows
    (:meth:`mined`) and the loss's labels are the B ones and 2B zeros."""

    name, metric, head, inputs = "itm", "itm_accuracy", "itm", ("itm_label",)
    chance = 0.5  # half the pairs are positive (with itc negatives a third: the metric itm_accuracy_chance says so)
    optional_inputs, output = ("itm_content", "itm_draw", "gather_bounds"), "seq_relationship_logits"
    reads = ("bert.pooler",)
    temperature = 0.1

    def build_head(self, config) -> nn.Linear:
        return nn.Linear(config.hidden_size, 2)

    def prepare(self, batch: dict, items: list[dict], ctx: PrepareContext) -> None:
        generators = [ctx.generator(x, self.name) for x in items]
        mined = ctx.itm_negatives == "itc"
        is_match = [mined or bool(torch.rand(1, generator=g) < 0.5) for g in generators]
        hard = ctx.itm_negatives in ("hard", "itc")
        batch.update(
            ctx.text.pad(
                [
                    {"input_ids": x["input_ids"] if m or hard else x["negative_input_ids"]}
                    for x, m in zip(items, is_match, strict=True)
                ]
            )
        )
        batch["itm_label"] = torch.tensor(is_match, dtype=torch.long)
        if hard:
            batch["itm_content"] = torch.tensor([x["content_id"] for x in items], dtype=torch.long)
            batch["itm_draw"] = torch.stack([torch.rand(2 if mined else 1, generator=g) for g in generators])
            batch["itm_draw"] = batch["itm_draw"] if mined else batch["itm_draw"].squeeze(1)
            if ctx.gather_bounds is not None:
                batch["gather_bounds"] = ctx.gather_bounds

    def before_encoder(self, model, inputs: VLInputs, labels: dict) -> VLInputs:
        """Hard negatives: ``inputs`` with the text of every label-0 row replaced by a caption drawn from the
        global batch in proportion to its similarity to the row's image (other content only): input_ids,
        token_type_ids, attention_mask [B, T'], T' the global batch's longest text. Draws
        (:func:`~vlbert.layers.sampling.draw_by_similarity`, no host sync) depend only on each row's ``itm_draw``
        and the global batch, so N processes at batch b draw as 1 process at N x b; several processes need the
        batch's ``gather_bounds`` (T' is then their text length).

        Raises:
            ValueError: several processes and no ``gather_bounds`` (:func:`gather_bounds`)."""
        if labels.get("itm_content") is None or labels.get("itm_label") is None:
            return inputs
        if labels["itm_draw"].dim() == 2:
            return self.mined(model, inputs, labels)
        ids, mask = inputs.input_ids, inputs.attention_mask
        with torch.no_grad():
            text = F.normalize(model.bert(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0].float(), dim=-1)
            image = F.normalize(model.bert(inputs.regions_alone()).last_hidden_state[:, 0].float(), dim=-1)
            bounds = gather_bounds(labels)
            gathered, valid = all_gather_padded(
                [text, ids, mask, labels["itm_content"]],
                bounds.rows,
                [None, bounds.text, bounds.text, None],
                local=not model.training,
            )
            all_text, all_ids, all_mask, all_content = gathered
            same = labels["itm_content"][:, None] == all_content[None, :]
            chosen = draw_by_similarity(image @ all_text.T / self.temperature, same, labels["itm_draw"], valid)
        negative = labels["itm_label"] == 0
        width = all_ids.shape[1]  # the gathered texts' (no host read of the new lengths)
        new_ids = torch.where(negative[:, None], all_ids[chosen], F.pad(ids, (0, width - ids.shape[1])))
        new_mask = torch.where(negative[:, None], all_mask[chosen], F.pad(mask, (0, width - ids.shape[1])))
        return inputs.replace(input_ids=new_ids, attention_mask=new_mask, token_type_ids=torch.zeros_like(new_ids))

    def mined(self, model, inputs: VLInputs, labels: dict) -> VLInputs:
        """``itc`` negatives: 3b rows, [the b pairs; caption i with a drawn image; a drawn caption with image i],
        text width and region count those of the global batch (see the module docstring)."""
        content, draw = labels["itm_content"], labels["itm_draw"]
        texts = {"input_ids": inputs.input_ids, "attention_mask": inputs.text_mask}
        regions = {"region_mask": inputs.regions_mask}
        for name in ("region_features", "region_boxes", "region_token_type_ids"):
            if getattr(inputs, name) is not None:
                regions[name] = getattr(inputs, name)
        bounds = gather_bounds(labels)
        widths = [None] * 3 + [bounds.text] * len(texts) + [bounds.regions] * len(regions)
        with torch.no_grad():
            text, image = ImageTextContrastive().embed(model, inputs, {})
            gathered, valid = all_gather_padded(
                [text, image, content, *texts.values(), *regions.values()], bounds.rows, widths, not model.training
            )
            all_text, all_image, all_content = gathered[:3]
            every = dict(zip([*texts, *regions], gathered[3:], strict=True))
            same = content[:, None] == all_content[None, :]
            temperature = model.itc.clamped_temperature().detach()
            image_of = draw_by_similarity(text @ all_image.T / temperature, same, draw[:, 0], valid)  # sim_t2i
            text_of = draw_by_similarity(image @ all_text.T / temperature, same, draw[:, 1], valid)  # sim_i2t
        rows = {}
        for name, own in {**texts, **regions}.items():
            own = _pad_to(own, every[name].shape[1])
            drawn = every[name][text_of if name in texts else image_of]
            rows[name] = torch.cat([own, own, drawn] if name in texts else [own, drawn, own])
        ids = rows["input_ids"]
        return inputs.replace(**rows, token_type_ids=torch.zeros_like(ids), masked_regions=None, layout=None)

    def predict(self, encoded: Encoded) -> torch.Tensor:
        """float [B, 2], the ITM logits of each (text, image) row (column 1 = the text matches the image)."""
        return getattr(encoded.model, self.head)(encoded.pooled)

    def loss(self, encoded: Encoded, labels) -> ObjectiveResult:
        logits, target = self.predict(encoded), labels["itm_label"]
        if labels.get("itm_draw") is not None and labels["itm_draw"].dim() == 2:  # itc: the pairs, then 2b negatives
            target = torch.cat([target, target.new_zeros(2 * target.shape[0])])
            loss, accuracy, n = classification_loss(logits, target)
            # a third of the rows match: answering "no match" throughout scores 2/3, not :attr:`chance`'s 0.5
            chance = torch.full((), 2.0 / 3.0, device=logits.device)
            squares = _pair_squares(logits, target)
            return ObjectiveResult(loss, accuracy, n, logits, {f"{self.metric}_chance": (chance, n)}, squares)
        loss, accuracy, n = classification_loss(logits, target)
        return ObjectiveResult(loss, accuracy, n, logits, squares=_pair_squares(logits, target))


def _pair_squares(logits: torch.Tensor, target: torch.Tensor):
    """:func:`~vlbert.objectives.base.item_squares` of each pair's cross-entropy and hit (held out only)."""
    if torch.is_grad_enabled():
        return None
    logits = upcast(logits.detach())
    return item_squares(F.cross_entropy(logits, target, reduction="none"), logits.argmax(-1) == target)


def gather_bounds(labels: dict) -> GatherBounds:
    """The batch's ``gather_bounds`` (what the collator's context gives: :class:`~vlbert.utils.GatherBounds`); in
    one process, where nothing is gathered, any (the recipe's collator gives them, a batch made by hand need not).

    Raises:
        ValueError: several processes and a batch without them (its collator was built without
            ``gather_bounds``)."""
    bounds = labels.get("gather_bounds")
    if bounds is None:
        if process_position()[1] > 1:
            raise ValueError(
                "ITM's hard and itc negatives across processes gather every rank's batch padded to known bounds: "
                "build the collator with gather_bounds (the VL pretraining recipe does)"
            )
        return GatherBounds(0, 0, 0)
    return bounds


def _pad_to(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t`` [B, W, ...] right-padded with zeros to [B, width, ...]."""
    pad = [0, 0] * (t.dim() - 2) + [0, width - t.shape[1]]
    return F.pad(t, pad)


__all__ = ["ImageTextMatching", "NEGATIVES", "content_id", "gather_bounds"]
