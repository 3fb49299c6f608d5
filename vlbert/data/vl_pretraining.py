"""Image-text pretraining batches: captions + regions, one objective per batch (UNITER section 3.2/4).

The batch's objective is named by its items (``item["objective"]``, drawn once per step for all ranks by
:class:`vlbert.objectives.ObjectiveMix` in the loader); its unit in :mod:`vlbert.objectives` masks the inputs
and adds its labels, one modality at a time (UNITER's conditional masking). Each sample's masking comes from its
own seed. Region features stay float16 until the model.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Sequence

from torch.utils.data import Dataset

from vlbert.data.pretraining import MaskingCollator
from vlbert.detectors.regions import Regions
from vlbert.detectors.store import region_count
from vlbert.layers.unpadded import stream_layouts, unpadded_layout
from vlbert.objectives import OBJECTIVES, PrepareContext
from vlbert.objectives.image_text_matching import content_id
from vlbert.processing import VLProcessor
from vlbert.processing.regions import pad_regions
from vlbert.utils import GatherBounds

#: Words that carry no content when comparing captions (articles, copulas, "image"-type framing).
_FRAMING_WORDS = frozenset(
    "a an the there is are this that of in on with it its image picture photo shows showing here".split()
)


def caption_content(text: str) -> str:
    """A caption's content key: lower-cased words without punctuation and framing words, so that "a blue
    circle" and "There is a blue circle." compare equal (ITM negatives must differ in content, not wording)."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return " ".join(w for w in words if w not in _FRAMING_WORDS)


@dataclass
class Caption:
    """An image-text pair: ``image_id``, the caption's wordpiece ids (no special tokens) and its ``content``
    key (captions with equal keys say the same thing; default :func:`caption_content` of the text); ``answers``:
    for a question, its answers with their scores ``((answer, score), ...)`` (the ``qa`` unit's targets)."""

    image_id: str
    token_ids: list[int]
    content: str
    answers: tuple[tuple[str, float], ...] = ()


class VLPretrainingDataset(Dataset):
    """Captions joined with their image's regions.

    Args:
        captions: the image-text pairs (one image may have several captions).
        regions: image id -> :class:`~vlbert.detectors.regions.Regions` (any mapping: a region store).
        processor: the run's :class:`~vlbert.processing.VLProcessor`, whose rules make every item (the captions'
            [CLS]/[SEP] and truncation, :meth:`~vlbert.processing.VLProcessor.wrap_ids`; the region limit,
            :meth:`~vlbert.processing.VLProcessor.region_item`).
        seed: for ITM negatives and masking.
        qa_answers: the answer vocabulary of the ``qa`` unit (empty: no answer labels).
    Items: dict with input_ids (list), negative_input_ids (a caption of another image with other content),
    content_id (int, the caption's content key: ITM's hard negatives skip captions of the same content),
    region_features float16 [R, D], region_boxes float32 [R, 4] normalised xyxy, class_probs float16 [R, C] or
    None, ``sample_seed``, and for a question with an answer in ``qa_answers`` ``answer_label`` (int: one of its
    answers drawn by score per epoch, as LXMERT's ``convert_example_to_features``, airsplay/lxmert@077c596).
    Raises:
        ValueError: no captions, a caption's image has no regions, or all captions say the same thing.
    """

    #: for a model with a visual backbone: image id -> pixels (:class:`~vlbert.processing.images.ImageReader`); items then
    #: carry ``pixels`` and the collator pads them into ``images`` / ``image_sizes`` in place of region_features.
    image_reader = None

    def __init__(
        self,
        captions: Sequence[Caption],
        regions: dict[str, Regions],
        processor: VLProcessor,
        seed: int = 0,
        qa_answers: Sequence[str] = (),
    ):
        if not captions:
            raise ValueError("no image-text pairs to pretrain on")
        missing = sorted(i for i in {c.image_id for c in captions} if i not in regions)  # one lookup per image
        if missing:
            raise ValueError(
                f"{len(missing)} captioned images have no regions (e.g. {missing[:3]}); extract regions "
                "for them (vlbert extract) or drop their captions"
            )
        if len({c.content for c in captions}) < 2:
            raise ValueError("every caption has the same content; image-text matching needs captions that differ")
        self.captions = list(captions)
        self.regions = regions
        self.processor, self.seed = processor, seed
        self.answer_ids = {a: i for i, a in enumerate(qa_answers)}
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.captions)

    def text_ids(self, caption: Caption) -> list[int]:
        """The caption's wordpiece ids with [CLS]/[SEP], truncated by the processor."""
        return self.processor.wrap_ids(caption.token_ids)

    def lengths(self) -> list[int]:
        """Text + region positions of every item (for length-grouped batching)."""
        return [
            len(self.text_ids(c)) + self.processor.kept_regions(region_count(self.regions, c.image_id))
            for c in self.captions
        ]

    def negative_for(self, index: int, rng: random.Random) -> Caption:
        """A caption of another image whose content differs from this one's (UNITER's ITM negatives, without
        false negatives that only reword the positive)."""
        own = self.captions[index]
        for _ in range(100):
            other = self.captions[rng.randrange(len(self.captions))]
            if other.image_id != own.image_id and other.content != own.content:
                return other
        return next(c for c in self.captions if c.image_id != own.image_id and c.content != own.content)

    def answer_label(self, caption: Caption, rng: random.Random) -> int | None:
        """The index of one of the question's known answers with a positive score, drawn in proportion to the
        scores; None for a caption or a question without such an answer."""
        known = [(self.answer_ids[a], score) for a, score in caption.answers if a in self.answer_ids and score > 0]
        if not known:
            return None
        return known[0][0] if len(known) == 1 else rng.choices([i for i, _ in known], [s for _, s in known])[0]

    def __getitem__(self, index: int) -> dict:
        caption = self.captions[index]
        seed = hash((self.seed, self.epoch, index)) & 0x7FFFFFFF
        rng = random.Random(seed)
        item = {
            "input_ids": self.text_ids(caption),
            "negative_input_ids": self.text_ids(self.negative_for(index, rng)),
            **self.processor.region_item(self.regions[caption.image_id], caption.image_id, self.image_reader),
            "sample_seed": seed,
            "content_id": content_id(caption.content),
        }
        label = self.answer_label(caption, rng) if caption.answers else None
        if label is not None:
            item["answer_label"] = label
        return item


class VLCollator:
    """Pad text and regions, then let the batch's objective unit mask and label it (and the units paired with
    it in ``objectives``, an :class:`~vlbert.objectives.ObjectiveMix`, add theirs: WRA on ITM batches).

    Output keys: input_ids, token_type_ids (0 for text), attention_mask [B, T]; region_features float16
    [B, R, D]; region_boxes float32 [B, R, 4]; region_mask [B, R] (1 = real); the objective's labels (see
    :mod:`vlbert.objectives`), with a ``packed`` text collator the unpadded ``layout`` of [text ; regions] and the
    MLM positions (as :class:`~vlbert.data.pretraining.MaskingCollator`), and ``objective`` (str; the trainer
    passes only what ``forward`` takes). ``two_stream``: the model unpads each stream by its own mask (LXMERT,
    ``model.encoder: two-stream``; the recipe sets it from the model's config): the layout is then the text's and
    the regions' (:func:`~vlbert.layers.unpadded.stream_layouts`) instead of the joint one. ``gather_bounds``: what
    any rank's batch can hold (:class:`~vlbert.utils.GatherBounds`), put into the batches of the units that gather
    the global batch (ITM's hard and itc negatives, ITC's evaluation), which several processes need.

    Raises:
        ValueError: items without an ``objective``, or one of different objectives.
    """

    def __init__(
        self,
        text: MaskingCollator,
        region_mask_probability: float = 0.15,
        objectives=None,
        itm_negatives: str = "random",
        two_stream: bool = False,
        gather_bounds: GatherBounds | None = None,
    ):
        self.two_stream = two_stream
        self.context = PrepareContext(
            text, region_mask_probability, dict(objectives.weights) if objectives else {}, itm_negatives, gather_bounds
        )
        self.objectives = objectives

    def __call__(self, items: list[dict]) -> dict:
        names = {x.get("objective") for x in items}
        if len(names) != 1 or None in names:
            raise ValueError(
                f"a VL pretraining batch needs one objective for all its items, got {sorted(map(str, names))}"
            )
        name = names.pop()
        batch = self.context.text.pad([{"input_ids": x["input_ids"]} for x in items])
        batch.update(pad_regions(items))
        OBJECTIVES[name].prepare(batch, items, self.context)
        for paired in self.objectives.runs_on(name) if self.objectives is not None else ():
            OBJECTIVES[paired].prepare(batch, items, self.context)  # e.g. WRA on the ITM batch
        # see MaskingCollator: the layout of [text ; regions] (the MLM unit adds its rows); not where the model
        # rewrites the text itself (ITM's hard negatives, itm_content): that layout is unknown here
        if self.context.text.lays_out and "itm_content" not in batch:
            layout = stream_layouts if self.two_stream else unpadded_layout
            batch["layout"] = layout(batch["attention_mask"], batch["region_mask"])
        batch["objective"] = name
        return batch


__all__ = ["Caption", "VLPretrainingDataset", "VLCollator", "caption_content"]
