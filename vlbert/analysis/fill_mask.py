"""Fill-mask: the masked LM's top-k fillers of each [MASK], for text and conditioned on an image's regions.

Same outputs as transformers' ``pipeline("fill-mask")`` (for text models: test), which a vision-language model
cannot use: here the regions of an image (``region_item`` of :mod:`vlbert.data.regions`) can join the text.
"""

from __future__ import annotations

import torch

from vlbert.data.regions import pad_regions


def region_inputs(regions_item: dict, device) -> dict[str, torch.Tensor]:
    """One image's region item (:func:`vlbert.data.regions.region_item`) as batch-of-one model inputs on ``device``."""
    return {k: v.to(device) for k, v in pad_regions([regions_item]).items()}


@torch.no_grad()
def fill_mask(model, tokenizer, text: str, top_k: int = 5, regions: dict | None = None) -> list[list[dict]]:
    """The ``top_k`` fillers of every [MASK] in ``text``.

    Args:
        model: :class:`vlbert.BertForPreTraining`, or :class:`vlbert.VLBertForPreTraining` (then ``regions`` may
            be given; without them the VL model reads the text alone).
        tokenizer: the model's tokenizer (its mask token is written ``[MASK]`` in ``text``).
        text: one sentence with at least one [MASK].
        top_k: fillers per mask.
        regions: an image's region item (``vlbert.data.regions.region_item(regions, max_regions)``), for VL models.
    Returns:
        one list per [MASK], in order, of ``top_k`` dicts ``{"score": probability, "token": id, "token_str":
        wordpiece, "sequence": the text with this filler}``, best first (transformers' fill-mask fields).
    Raises:
        ValueError: no [MASK] in ``text``; regions given to a text-only model.
    """
    enc = tokenizer(text, return_tensors="pt")
    positions = (enc["input_ids"][0] == tokenizer.mask_token_id).nonzero().squeeze(1).tolist()
    if not positions:
        raise ValueError(f"no {tokenizer.mask_token} in {text!r}; write the word to fill as {tokenizer.mask_token}")
    device = next(model.parameters()).device
    inputs = {k: enc[k].to(device) for k in ("input_ids", "token_type_ids", "attention_mask")}
    if regions is not None:
        if not hasattr(model.config, "region_feature_dim"):
            raise ValueError(f"{type(model).__name__} reads no regions; use a VLBertForPreTraining")
        inputs.update(region_inputs(regions, device))
    was_training = model.training
    model.eval()
    try:
        out = model(**inputs)
    finally:
        model.train(was_training)
    probs = out.prediction_logits[0, positions].float().softmax(-1)
    results = []
    for row, position in zip(probs, positions):
        scores, ids = row.topk(top_k)
        fillers = []
        for score, token in zip(scores.tolist(), ids.tolist()):
            filled = enc["input_ids"][0].clone()
            filled[position] = token
            fillers.append({"score": score, "token": token, "token_str": tokenizer.decode([token]),
                            "sequence": tokenizer.decode(filled, skip_special_tokens=True)})
        results.append(fillers)
    return results


__all__ = ["fill_mask", "region_inputs"]
