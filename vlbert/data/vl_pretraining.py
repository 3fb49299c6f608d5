"""Image-text pretraining batches: captions + regions, one objective per batch (UNITER section 3.2/4).

Each batch is built for one task drawn from a configured mix, masking one modality at a time (UNITER's
conditional masking): ``mlm`` masks 15% of caption wordpieces (BERT's 80/10/10) with all regions visible; ``mrfr``
and ``mrc`` mask 15% of the real regions (at least one; features zeroed, as UNITER) with the caption intact;
``itm`` pairs half of the images with the caption of another image whose caption differs (label 0) and the rest
with their own (label 1). Region features stay float16 until the model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from detectors.regions import Regions
from vlbert.data.pretraining import MaskingCollator

TASKS = ("mlm", "mrfr", "mrc", "itm")


@dataclass
class Caption:
    """An image-text pair: ``image_id`` and the caption's wordpiece ids (no special tokens)."""

    image_id: str
    token_ids: list[int]
    text: str = ""


class VLPretrainingDataset(Dataset):
    """Captions joined with their image's regions.

    Args:
        captions: the image-text pairs (one image may have several captions).
        regions: image id -> :class:`~detectors.regions.Regions`.
        tokenizer: for [CLS]/[SEP].
        max_text_length: wordpieces including [CLS] and [SEP].
        max_regions: keep at most this many regions per image (the first ones: whole image first).
        seed: for ITM negatives and masking.
    Items: dict with input_ids (list), negative_input_ids (a caption of another image with different text),
    region_features float16 [R, D], region_boxes float32 [R, 4] normalised xyxy, class_probs float16 [R, C] or None,
    and ``sample_seed``.
    Raises:
        ValueError: no captions, or a caption's image has no regions.
    """

    def __init__(self, captions: Sequence[Caption], regions: dict[str, Regions], tokenizer, max_text_length: int = 40,
                 max_regions: int = 36, seed: int = 0):
        if not captions:
            raise ValueError("no image-text pairs to pretrain on")
        missing = sorted({c.image_id for c in captions if c.image_id not in regions})
        if missing:
            raise ValueError(f"{len(missing)} captioned images have no regions (e.g. {missing[:3]}); extract regions "
                             "for them (tools/extract_regions.py) or drop their captions")
        self.captions = list(captions)
        self.regions = regions
        self.cls_id, self.sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        self.max_text_length, self.max_regions, self.seed = max_text_length, max_regions, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.captions)

    def text_ids(self, caption: Caption) -> list[int]:
        return [self.cls_id, *caption.token_ids[: self.max_text_length - 2], self.sep_id]

    def lengths(self) -> list[int]:
        """Text + region positions of every item (for length-grouped batching)."""
        return [len(self.text_ids(c)) + min(self.regions[c.image_id].num_regions, self.max_regions)
                for c in self.captions]

    def negative_for(self, index: int, rng: random.Random) -> Caption:
        """A caption of another image whose text differs from this one's (UNITER's ITM negatives)."""
        own = self.captions[index]
        for _ in range(50):
            other = self.captions[rng.randrange(len(self.captions))]
            if other.image_id != own.image_id and other.token_ids != own.token_ids:
                return other
        raise ValueError("could not find a caption of another image with different text for ITM; the dataset "
                         "needs at least two distinct captions")

    def __getitem__(self, index: int) -> dict:
        caption = self.captions[index]
        seed = hash((self.seed, self.epoch, index)) & 0x7FFFFFFF
        r = self.regions[caption.image_id]
        n = min(r.num_regions, self.max_regions)
        return {
            "input_ids": self.text_ids(caption),
            "negative_input_ids": self.text_ids(self.negative_for(index, random.Random(seed))),
            "region_features": r.features[:n],
            "region_boxes": r.normalised_boxes()[:n],
            "class_probs": r.class_probs[:n] if r.class_probs is not None else None,
            "sample_seed": seed,
        }


def pad_regions(items: list[dict]) -> dict[str, torch.Tensor]:
    """Pad per-image regions into a batch.

    Args:
        items: dicts with ``region_features`` (float16 [R_i, D]) and ``region_boxes`` (float32 [R_i, 4],
            normalised xyxy).
    Returns:
        region_features float16 [B, R, D], region_boxes float32 [B, R, 4], region_mask int64 [B, R] (1 = real),
        R = max R_i.
    """
    b = len(items)
    r = max(len(x["region_features"]) for x in items)
    d = items[0]["region_features"].shape[1]
    feats = torch.zeros(b, r, d, dtype=torch.float16)
    boxes = torch.zeros(b, r, 4, dtype=torch.float32)
    mask = torch.zeros(b, r, dtype=torch.long)
    for i, x in enumerate(items):
        n = len(x["region_features"])
        feats[i, :n] = torch.from_numpy(np.asarray(x["region_features"], dtype=np.float16))
        boxes[i, :n] = torch.from_numpy(np.asarray(x["region_boxes"], dtype=np.float32))
        mask[i, :n] = 1
    return {"region_features": feats, "region_boxes": boxes, "region_mask": mask}


@dataclass
class VLCollator:
    """Pad text and regions, pick the batch's task from ``task_weights`` and apply its masking.

    Output keys (all tensors): input_ids, token_type_ids (0 for text), attention_mask [B, T]; region_features
    float16 [B, R, D]; region_boxes float32 [B, R, 4]; region_mask [B, R] (1 = real); and per task: ``labels``
    (mlm), ``masked_regions`` bool [B, R] + ``region_targets`` float16 [B, R, D] (mrfr) or ``region_labels``
    float [B, R, C] (mrc), ``itm_label`` [B] (itm). ``task`` (str) names the task; drop it before the model if
    calling it directly (the trainer removes it).
    """

    text: MaskingCollator
    task_weights: dict[str, float] = field(default_factory=lambda: {"mlm": 2.0, "mrfr": 1.0, "mrc": 1.0, "itm": 1.0})
    region_mask_probability: float = 0.15
    force_task: str | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.task_weights) - set(TASKS))
        if unknown or not self.task_weights:
            raise ValueError(f"unknown pretraining task(s) {unknown}; the tasks are {TASKS}")
        if any(w < 0 for w in self.task_weights.values()) or sum(self.task_weights.values()) <= 0:
            raise ValueError(f"task weights must be >= 0 with a positive sum, got {self.task_weights}")

    def choose_task(self, generator: torch.Generator) -> str:
        if self.force_task:
            return self.force_task
        names = [t for t in TASKS if self.task_weights.get(t, 0) > 0]
        weights = torch.tensor([self.task_weights[t] for t in names], dtype=torch.float)
        return names[int(torch.multinomial(weights, 1, generator=generator))]

    def mask_regions(self, region_mask: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """bool [B, R]: round(p x real regions), at least one, chosen uniformly among each image's real regions."""
        real = region_mask.bool()
        n_real = real.sum(1)
        n_chosen = (n_real.double() * self.region_mask_probability).round().clamp(min=1).long()
        scores = torch.rand(region_mask.shape, generator=generator).masked_fill(~real, 2.0)
        return scores.argsort(1).argsort(1) < n_chosen[:, None]

    def __call__(self, items: list[dict]) -> dict:
        seed = hash(tuple(x["sample_seed"] for x in items)) & 0x7FFFFFFFFFFF
        generator = torch.Generator().manual_seed(seed)
        task = self.choose_task(generator)
        if task == "itm":
            is_match = torch.rand(len(items), generator=generator) < 0.5
            texts = [{"input_ids": x["input_ids"] if m else x["negative_input_ids"]} for x, m in zip(items, is_match)]
        else:
            texts = [{"input_ids": x["input_ids"]} for x in items]
        batch = self.text.pad(texts)
        batch.update(pad_regions(items))
        batch["task"] = task
        if task == "mlm":
            batch["input_ids"], batch["labels"] = self.text.mask(batch["input_ids"], generator)
        elif task in ("mrfr", "mrc"):
            if task == "mrc" and items[0]["class_probs"] is None:
                raise ValueError("the mrc task needs the detector's class distributions (class_probs) in the shards")
            masked = self.mask_regions(batch["region_mask"], generator)
            batch["masked_regions"] = masked
            if task == "mrfr":
                batch["region_targets"] = batch["region_features"].clone()
            else:
                c = items[0]["class_probs"].shape[1]
                probs = torch.zeros(len(items), masked.shape[1], c, dtype=torch.float16)
                for i, x in enumerate(items):
                    probs[i, : len(x["class_probs"])] = torch.from_numpy(np.asarray(x["class_probs"]))
                batch["region_labels"] = probs
            batch["region_features"] = batch["region_features"].masked_fill(masked[..., None], 0.0)
        else:
            batch["itm_label"] = is_match.long()
        return batch


__all__ = ["Caption", "VLPretrainingDataset", "VLCollator", "TASKS", "pad_regions"]
