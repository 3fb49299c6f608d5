"""How much of a word's word-region-alignment transport goes to the regions of the object it names (UNITER
section 3.2 shows WRA's plan aligning words with regions; this counts it).

On easy-VQA images (one shape on a plain background) the object's box is found from the pixels
(:func:`object_box`); a region is the object's when its box has IoU >= 0.5 with it and background when IoU < 0.1
(regions between, and the whole-image region, are left out). For a caption "a <colour> <shape>", the share of the
colour word's and the shape word's transported mass (:func:`vlbert.analysis.attention_maps.word_region_transport`)
on the object's regions, among object + background regions, is compared with the share a plan blind to content
would give (the object regions' count over both counts).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch
from torchvision.ops import box_iou

from vlbert.analysis.attention_maps import word_region_transport
from vlbert.detectors.regions import Regions
from vlbert.processing import VLProcessor
from vlbert.processing.regions import pad_regions


def object_box(image: np.ndarray, threshold: int = 60, min_pixels: int = 20) -> np.ndarray | None:
    """The pixel box (x1, y1, x2, y2), float32 [4], of the pixels that differ from the background colour (the
    median of the border pixels) by more than ``threshold`` (summed over RGB); None when fewer than ``min_pixels``
    differ. image: uint8 [H, W, 3]."""
    pixels = image.astype(np.int64)
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    differs = np.abs(pixels - np.median(border, 0)).sum(-1) > threshold
    if differs.sum() < min_pixels:
        return None
    ys, xs = np.nonzero(differs)
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=np.float32)


def region_roles(regions: Regions, box: np.ndarray, max_regions: int) -> tuple[np.ndarray, np.ndarray]:
    """(object, background): bool [R] over the first ``max_regions`` regions: IoU >= 0.5 with ``box`` (pixels
    xyxy), IoU < 0.1; the region covering (95% of) the whole image is neither."""
    boxes = torch.as_tensor(regions.boxes[:max_regions], dtype=torch.float32)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    whole = area >= 0.95 * regions.width * regions.height
    iou = box_iou(boxes, torch.as_tensor(box[None], dtype=torch.float32))[:, 0]
    return ((iou >= 0.5) & ~whole).numpy(), ((iou < 0.1) & ~whole).numpy()


def alignment_share(
    model, processor: VLProcessor, examples: Iterable[tuple[str, Regions, np.ndarray, tuple[str, ...]]]
) -> dict[str, float]:
    """The mean share of each named word's transported mass on its object's regions.

    Args:
        model: a :class:`vlbert.VLBertForPreTraining` (eval mode).
        processor: its :class:`~vlbert.processing.VLProcessor` (its tokenizer; the regions it keeps per image).
        examples: (caption, the image's regions, the object's pixel box, the caption's words that name the object;
            a word of several wordpieces counts with the mean of their rows); a word not in the caption, or an image
            without object or background regions, is skipped.
    Returns:
        ``{"words": n, "share": the mean share on the object's regions, "uniform": the mean share of a plan blind
        to content, "images": images used, "by_word": [the mean share of the examples' first named word, of their
        second, ...] (None where no example's k-th word was counted)}``.
    """
    shares, uniform, images, by_word = [], [], 0, {}
    for caption, regions, box, words in examples:
        tokenizer = processor.tokenizer
        on_object, background = region_roles(regions, box, processor.max_regions)
        if not on_object.any() or not background.any():
            continue
        enc = tokenizer(caption, return_tensors="pt")
        tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
        plan, _ = word_region_transport(model, enc["input_ids"], pad_regions([processor.region_item(regions)]))
        images += 1
        for k, word in enumerate(words):
            by_word.setdefault(k, [])
            rows = _pieces(tokens, tokenizer.tokenize(word))
            if rows is None:
                continue
            row = plan[rows].mean(0)[: len(on_object)]
            counted = row[on_object | background].sum()
            shares.append(float(row[on_object].sum() / max(counted, 1e-12)))
            by_word[k].append(shares[-1])
            uniform.append(on_object.sum() / (on_object | background).sum())
    return {
        "words": len(shares),
        "share": float(np.mean(shares)) if shares else float("nan"),
        "uniform": float(np.mean(uniform)) if uniform else float("nan"),
        "images": images,
        "by_word": [float(np.mean(by_word[k])) if by_word[k] else None for k in sorted(by_word)],
    }


def _pieces(tokens: list[str], word: list[str]) -> slice | None:
    """The positions of the wordpieces ``word`` in ``tokens`` (first occurrence), or None."""
    for start in range(len(tokens) - len(word) + 1):
        if tokens[start : start + len(word)] == word:
            return slice(start, start + len(word))
    return None


__all__ = ["object_box", "region_roles", "alignment_share"]
