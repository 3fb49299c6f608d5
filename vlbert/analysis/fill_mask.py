"""Fill-mask for one text: the masked LM's top-k fillers of each [MASK], for text and conditioned on an image's
regions, as transformers' ``pipeline("fill-mask")`` returns them (for text models: tests/inference/test_analysis.py).

The computation is inference's (:func:`vlbert.inference.fill_mask.fill_masks`, batched); this is the one-text form
that ``vlbert explain fill-mask`` and notebooks call with a model in memory.
"""

from __future__ import annotations

from vlbert.inference.fill_mask import fill_masks


def fill_mask(model, tokenizer, text: str, top_k: int = 5, regions: dict | None = None) -> list[list[dict]]:
    """The ``top_k`` fillers of every [MASK] in ``text``.

    Args:
        model: :class:`vlbert.BertForPreTraining`, or :class:`vlbert.VLBertForPreTraining` (then ``regions`` may
            be given; without them the VL model reads the text alone).
        tokenizer: the model's tokenizer (its mask token is written ``[MASK]`` in ``text``).
        text: one sentence with at least one [MASK].
        top_k: fillers per mask.
        regions: an image's region item (``vlbert.processing.regions.region_item(regions, max_regions)``), for VL models.
    Returns:
        one list per [MASK], in order, of ``top_k`` dicts ``{"score": probability, "token": id, "token_str":
        wordpiece, "sequence": the text with this filler}``, best first (transformers' fill-mask fields).
    Raises:
        ValueError: no [MASK] in ``text``; regions given to a text-only model.
    """
    return fill_masks(model, tokenizer, [text], top_k, None if regions is None else [regions])[0]


__all__ = ["fill_mask"]
