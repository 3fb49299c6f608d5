"""Image-text retrieval data: captioned images from easy-VQA or the Karpathy-split caption JSON (COCO,
Flickr30K), batches of aligned pairs, and the two-stage Recall@K evaluation."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from detectors.regions import Regions
from vlbert.utils import evaluation
from vlbert.data.pretraining import MaskingCollator
from vlbert.data.vl_pretraining import pad_regions
from vlbert.evaluation.retrieval import recall_at_k


@dataclass(frozen=True)
class CaptionedImage:
    """An image and its captions. ``group``: images of the same group are interchangeable for their captions
    (e.g. easy-VQA's "a blue circle" fits every blue circle); by default each image is its own group."""

    image_id: str
    captions: tuple[str, ...]
    group: str = ""


def easy_vqa_captioned(split: str, seed: int = 0) -> list[CaptionedImage]:
    """easy-VQA images of ``split`` with one templated caption each, grouped by (colour, shape)."""
    import random

    from vlbert.data.easy_vqa import CAPTION_TEMPLATES, captions

    rng = random.Random(f"retrieval-{seed}-{split}")
    return [CaptionedImage(i, (rng.choice(CAPTION_TEMPLATES).format(color=c, shape=s),), f"{c} {s}")
            for i, (c, s) in captions(split).items()]


def load_karpathy_split(path: str | os.PathLike, split: str, image_id_format: str = "{filename}") -> list[CaptionedImage]:
    """Read Karpathy & Fei-Fei's ``dataset_coco.json`` / ``dataset_flickr30k.json``.

    Args:
        split: "train" (COCO's "restval" included), "val" or "test".
        image_id_format: the shard image id from the record's fields, e.g. ``"{cocoid}"`` or ``"{filename}"``.
    Raises:
        ValueError: the file lacks ``images`` or the split is empty.
    """
    data = json.loads(Path(path).read_text())
    if "images" not in data:
        raise ValueError(f"{path} has no 'images' list; is it a Karpathy-split caption file?")
    wanted = {"train", "restval"} if split == "train" else {split}
    out = [CaptionedImage(image_id_format.format(**{k: v for k, v in img.items() if k != "sentences"}),
                          tuple(s["raw"] for s in img["sentences"]))
           for img in data["images"] if img.get("split") in wanted]
    if not out:
        raise ValueError(f"{path} has no images in split {split!r}")
    return out


class RetrievalPairs(torch.utils.data.Dataset):
    """One item per (image, caption) pair: caption ids, the image's regions and its group id.

    Raises:
        ValueError: an image has no regions.
    """

    def __init__(self, images: Sequence[CaptionedImage], regions: dict[str, Regions], tokenizer,
                 max_text_length: int = 32, max_regions: int = 36):
        missing = [im.image_id for im in images if im.image_id not in regions]
        if missing:
            raise ValueError(f"{len(missing)} images have no regions (e.g. {missing[:3]}); extract them first")
        groups = {g: k for k, g in enumerate(sorted({im.group or im.image_id for im in images}))}
        self.pairs = [(im, c, groups[im.group or im.image_id]) for im in images for c in im.captions]
        self.input_ids = tokenizer([c for _, c, _ in self.pairs], truncation=True, max_length=max_text_length)["input_ids"]
        self.regions, self.max_regions = regions, max_regions

    def __len__(self) -> int:
        return len(self.pairs)

    def lengths(self) -> list[int]:
        return [len(ids) for ids in self.input_ids]

    def __getitem__(self, index: int) -> dict:
        image, _, group = self.pairs[index]
        r = self.regions[image.image_id]
        n = min(r.num_regions, self.max_regions)
        return {"input_ids": self.input_ids[index], "region_features": r.features[:n],
                "region_boxes": r.normalised_boxes()[:n], "group": group}


class RetrievalCollator:
    """Batches of aligned pairs for :class:`~vlbert.models.vl.VLBertForImageTextRetrieval` training."""

    def __init__(self, tokenizer):
        self.text = MaskingCollator.from_tokenizer(tokenizer)
        self.cls_sep = torch.tensor([tokenizer.cls_token_id, tokenizer.sep_token_id])

    def __call__(self, items: list[dict]) -> dict:
        batch = self.text.pad([{"input_ids": x["input_ids"]} for x in items])
        batch.update(pad_regions(items))
        batch["group_ids"] = torch.tensor([x["group"] for x in items])
        batch["cls_sep_ids"] = self.cls_sep
        return batch


@evaluation
def evaluate_retrieval(model, images: Sequence[CaptionedImage], regions: dict[str, Regions], tokenizer,
                       shortlist: int = 16, batch_size: int = 128, max_regions: int = 36,
                       ks: Sequence[int] = (1, 5, 10), return_scores: bool = False):
    """Recall@K for image->text and text->image: contrastive scores over all pairs pick a ``shortlist`` per
    query, which the cross-encoder re-ranks; items outside the shortlist rank after it in contrastive order.

    Cross-encoder passes: (#images + #captions) x shortlist, instead of #images x #captions.
    Returns ``i2t_r1``... and ``t2i_r1``... (strict: only the image's own captions count), the same with
    ``_group`` (any caption/image of the same group counts), and ``cross_encoder_pairs``. With
    ``return_scores``, also the final (image x caption) and (caption x image) score matrices.
    """
    device = next(model.parameters()).device
    text = MaskingCollator.from_tokenizer(tokenizer)
    captions = [(k, c) for k, im in enumerate(images) for c in im.captions]
    ids = tokenizer([c for _, c in captions], truncation=True, max_length=32)["input_ids"]
    items = []
    for im in images:
        r = regions[im.image_id]
        n = min(r.num_regions, max_regions)
        items.append({"region_features": r.features[:n], "region_boxes": r.normalised_boxes()[:n]})

    def text_batch(rows):
        return {k: v.to(device) for k, v in text.pad([{"input_ids": ids[i]} for i in rows]).items()}

    def image_batch(rows):
        return {k: v.to(device) for k, v in pad_regions([items[i] for i in rows]).items()}

    t_emb = torch.cat([model.embed_text(**text_batch(range(s, min(s + batch_size, len(ids)))))
                       for s in range(0, len(ids), batch_size)])
    cls_sep = (tokenizer.cls_token_id, tokenizer.sep_token_id)
    v_emb = torch.cat([model.embed_image(**image_batch(range(s, min(s + batch_size, len(items)))), cls_sep=cls_sep)
                       for s in range(0, len(items), batch_size)])
    sim = (v_emb @ t_emb.T).cpu()  # [images, captions]

    def rerank(scores: torch.Tensor, image_of_pair) -> torch.Tensor:
        """scores [Q, N] contrastive; returns [Q, N] with the shortlist re-scored by the cross-encoder."""
        top = scores.topk(min(shortlist, scores.shape[1]), dim=1).indices
        pairs = [(q, n) for q in range(scores.shape[0]) for n in top[q].tolist()]
        final = scores - 1e4  # everything outside the shortlist ranks after it, in contrastive order
        for s in range(0, len(pairs), batch_size):
            chunk = pairs[s:s + batch_size]
            img_rows, cap_rows = zip(*(image_of_pair(q, n) for q, n in chunk))
            batch = {**text_batch(cap_rows), **image_batch(img_rows)}
            cross = model.match_scores(**batch).cpu()
            for (q, n), value in zip(chunk, cross.tolist()):
                final[q, n] = value
        return final, len(pairs)

    i2t, n1 = rerank(sim, lambda q, n: (q, n))
    t2i, n2 = rerank(sim.T.contiguous(), lambda q, n: (n, q))
    own = [{c for c, (img, _) in enumerate(captions) if img == i} for i in range(len(images))]
    group = [{c for c, (img, _) in enumerate(captions) if images[img].group and images[img].group == im.group}
             or own[i] for i, im in enumerate(images)]
    image_of_caption = [img for img, _ in captions]
    out = {"cross_encoder_pairs": n1 + n2, "all_pairs": len(images) * len(captions)}
    for name, scores, positives in (("i2t", i2t, own), ("i2t_group", i2t, group),
                                    ("t2i", t2i, [{image_of_caption[c]} for c in range(len(captions))]),
                                    ("t2i_group", t2i, [{j for j, im in enumerate(images)
                                                         if im.group and im.group == images[image_of_caption[c]].group}
                                                        or {image_of_caption[c]} for c in range(len(captions))])):
        for kk, value in recall_at_k(scores, positives, ks).items():
            base, _, suffix = name.partition("_")
            out[f"{base}_r{kk}" + (f"_{suffix}" if suffix else "")] = value
    return (out, i2t, t2i) if return_scores else out


__all__ = ["CaptionedImage", "easy_vqa_captioned", "load_karpathy_split", "RetrievalPairs", "RetrievalCollator",
           "evaluate_retrieval"]
