"""Fill-mask: the masked LM's top-k fillers of each [MASK] in a batch of texts, given an image's regions (a VL
model) or the text alone, as transformers' ``pipeline("fill-mask")`` returns them: :func:`fill_masks` is the core
(one forward per batch), :class:`FillMaskPipeline` / :class:`TextFillMaskPipeline` run it from a pretraining run or a
model in memory, and :func:`vlbert.analysis.fill_mask.fill_mask` is its one-text form."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from vlbert.inference.base import Pipeline
from vlbert.models.bert import BertForPreTraining
from vlbert.models.modernbert import ModernBertForMaskedLM
from vlbert.models.vl import VLBertForPreTraining
from vlbert.processing.regions import pad_regions


@torch.no_grad()
def fill_masks(
    model,
    tokenizer,
    texts: Sequence[str],
    top_k: int = 5,
    regions: Sequence[dict] | None = None,
    max_length: int | None = None,
) -> list[list[list[dict]]]:
    """The ``top_k`` fillers of every [MASK] of every text, in one forward pass over the padded batch.

    Args:
        model: :class:`vlbert.BertForPreTraining` or :class:`vlbert.ModernBertForMaskedLM`, or
            :class:`vlbert.VLBertForPreTraining` (then ``regions`` may be given; without them it reads the texts
            alone). Run in eval mode (its mode is restored after).
        tokenizer: the model's tokenizer (its mask token, e.g. ``[MASK]``, written in the texts; its
            ``token_type_ids`` passed where it gives them).
        texts: B texts, each with at least one [MASK].
        top_k: fillers per mask.
        regions: one region item per text (:func:`vlbert.processing.regions.region_item`: region_features float16 [R, D],
            region_boxes float32 [R, 4] normalised xyxy), or None.
        max_length: truncate the texts to this many wordpieces ([CLS]/[SEP] included), as the run's dataset did;
            None: no truncation.
    Returns:
        per text, one list per [MASK] in order, of ``top_k`` dicts ``{"score": probability, "token": id,
        "token_str": wordpiece, "sequence": the text with this filler (special tokens kept where the text has other
        masks, which stay visible)}``, best first (transformers' fill-mask fields and values, ``FillMaskPipeline``
        at v5.23: tests/inference/test_analysis.py compares them).
    Raises:
        ValueError: a text without [MASK] (named, with the fix); regions given to a text-only model, or a number
            of region items other than the number of texts.
    """
    enc = tokenizer(
        list(texts), padding=True, truncation=max_length is not None, max_length=max_length, return_tensors="pt"
    )
    is_mask = enc["input_ids"] == tokenizer.mask_token_id
    for text, row in zip(texts, is_mask, strict=True):
        if not row.any():
            raise ValueError(f"no {tokenizer.mask_token} in {text!r}; write the word to fill as {tokenizer.mask_token}")
    device = next(model.parameters()).device
    inputs = {k: enc[k].to(device) for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc}
    if regions is not None:
        if not hasattr(model.config, "region_feature_dim"):
            raise ValueError(f"{type(model).__name__} reads no regions; use a VLBertForPreTraining")
        if len(regions) != len(texts):
            raise ValueError(f"{len(regions)} region items for {len(texts)} texts: pass one per text")
        inputs.update({k: v.to(device) for k, v in pad_regions(list(regions)).items()})
    was_training = model.training
    model.eval()
    try:
        logits = model(**inputs).prediction_logits
    finally:
        model.train(was_training)
    rows, positions = is_mask.nonzero(as_tuple=True)
    scores, ids = logits[rows.to(device), positions.to(device)].float().softmax(-1).topk(top_k, dim=-1)
    results: list[list[list[dict]]] = [[] for _ in texts]
    for row, position, row_scores, row_ids in zip(
        rows.tolist(), positions.tolist(), scores.tolist(), ids.tolist(), strict=True
    ):
        length = int(enc["attention_mask"][row].sum())
        single = int(is_mask[row].sum()) == 1  # as transformers: with other masks left, keep the special tokens
        fillers = []
        for score, token in zip(row_scores, row_ids, strict=True):
            filled = enc["input_ids"][row, :length].clone()
            filled[position] = token
            fillers.append(
                {
                    "score": score,
                    "token": token,
                    "token_str": tokenizer.decode([token]),
                    "sequence": tokenizer.decode(filled, skip_special_tokens=single),
                }
            )
        results[row].append(fillers)
    return results


class FillMaskPipeline(Pipeline):
    """(image, text with [MASK]) -> the top-k fillers (:func:`fill_masks`' transformers-style dicts: ``score``,
    ``token``, ``token_str``, ``sequence``) given the image's regions, shaped as transformers' fill-mask pipeline
    shapes them: a list of dicts for a text with one [MASK], one such list per [MASK] for a text with several;
    ``image=None`` reads the text alone. Lists -> a list of results. Each ``batch_size`` chunk is one forward pass (two where it mixes examples
    with and without an image)."""

    name = "fill-mask"
    model_class = VLBertForPreTraining
    optional_fields = ("image",)
    parameters = {"top_k": 5}

    def preprocess(self, examples: list[dict], **parameters) -> dict[str, Any]:
        """Each example's text and region item (None without an image), and ``top_k``."""
        images = [k for k, ex in enumerate(examples) if ex.get("image") is not None]
        items = dict(
            zip(images, self.processor.region_items(self.regions([examples[k]["image"] for k in images])), strict=True)
        )
        return {
            "texts": [ex["text"] for ex in examples],
            "items": [items.get(k) for k in range(len(examples))],
            "top_k": parameters.get("top_k", 5),
        }

    def _forward(self, model_inputs: dict[str, Any]) -> dict[str, Any]:
        """:func:`fill_masks` over the chunk: one pass for the examples with regions, one for those without."""
        texts, items, top_k = model_inputs["texts"], model_inputs["items"], model_inputs["top_k"]
        fillers: list = [None] * len(texts)
        for with_image in (True, False):
            group = [k for k, item in enumerate(items) if (item is not None) == with_image]
            if group:
                found = fill_masks(
                    self.model,
                    self.tokenizer,
                    [texts[k] for k in group],
                    top_k,
                    [items[k] for k in group] if with_image else None,
                    self.processor.max_text_length,
                )
                for k, result in zip(group, found, strict=True):
                    fillers[k] = result
        return {"fillers": fillers}

    def postprocess(self, outputs, examples, top_k: int = 5) -> list:
        """Per text, as transformers' fill-mask pipeline gives it: the ``top_k`` filler dicts of its one [MASK],
        or, for a text with several, one such list per [MASK] in order."""
        return [fillers[0] if len(fillers) == 1 else fillers for fillers in outputs["fillers"]]

    def row(self, result) -> dict:
        return {"fillers": result}


class TextFillMaskPipeline(FillMaskPipeline):
    """A text pretraining run's fill-mask: (text with [MASK]) -> per [MASK], the top-k fillers, as
    :class:`FillMaskPipeline` without an image (BERT's masked LM, section 3.1; or ModernBERT's, a run whose
    config.json names ``ModernBertForMaskedLM``)."""

    name = "text-fill-mask"
    model_class = BertForPreTraining
    model_classes = (ModernBertForMaskedLM,)
    input_fields = {"text": ("text",)}
    image_fields = ()
    optional_fields = ()


__all__ = ["fill_masks", "FillMaskPipeline", "TextFillMaskPipeline"]
