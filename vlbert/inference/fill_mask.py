"""Fill-mask from a pretraining run: the top-k fillers of each [MASK] in a text, given an image's regions (a VL
run) or the text alone (a text run), as transformers' ``pipeline("fill-mask")`` returns them."""

from __future__ import annotations

from typing import Any

from vlbert.analysis.fill_mask import fill_mask
from vlbert.inference.base import Pipeline
from vlbert.models.bert import BertForPreTraining
from vlbert.models.vl import VLBertForPreTraining


class FillMaskPipeline(Pipeline):
    """(image, text with [MASK]) -> per [MASK], the top-k fillers (:func:`vlbert.analysis.fill_mask.fill_mask`'s
    transformers-style dicts: ``score``, ``token``, ``token_str``, ``sequence``) given the image's regions;
    ``image=None`` reads the text alone. Lists -> a list of results."""

    tasks = ("vl-pretraining",)
    model_class = VLBertForPreTraining
    optional_fields = ("image",)
    parameters = {"top_k": 5}

    def preprocess(self, examples: list[dict], **parameters) -> dict[str, Any]:
        """Each example's text and region item (None without an image)."""
        images = [k for k, ex in enumerate(examples) if ex.get("image") is not None]
        items = dict(zip(images, self.inputs.region_items(self.regions([examples[k]["image"] for k in images]))))
        return {"texts": [ex["text"] for ex in examples], "items": [items.get(k) for k in range(len(examples))]}

    def _forward(self, model_inputs: dict[str, Any]) -> dict[str, Any]:
        return model_inputs  # fill_mask runs the model per text, in postprocess

    def postprocess(self, outputs, examples, top_k: int = 5) -> list[list[list[dict]]]:
        return [fill_mask(self.model, self.tokenizer, text, top_k, item)
                for text, item in zip(outputs["texts"], outputs["items"])]

    def row(self, result) -> dict:
        return {"fillers": result}


class TextFillMaskPipeline(FillMaskPipeline):
    """A text pretraining run's fill-mask: (text with [MASK]) -> per [MASK], the top-k fillers, as
    :class:`FillMaskPipeline` without an image (BERT's masked LM, section 3.1)."""

    tasks = ("text-pretraining",)
    model_class = BertForPreTraining
    input_fields = {"text": ("text",)}
    image_fields = ()
    optional_fields = ()


__all__ = ["FillMaskPipeline", "TextFillMaskPipeline"]
