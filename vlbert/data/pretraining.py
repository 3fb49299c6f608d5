"""BERT pretraining data: the pieces of segment pairs and dynamic masking for masked LM shared by every corpus.

Source: BERT paper section 3.1 and appendix A.1, and the reference ``create_pretraining_data.py``
(google-research/bert). The pairs themselves (chunks filling a target length, A and B with B the true continuation
50% of the time) are drawn from the prepared corpus by :mod:`vlbert.data.corpus_pairs`; 15% of wordpieces are chosen for prediction, of which 80% become [MASK], 10% a
random token and 10% stay unchanged. Masking is drawn anew every time a batch is built (dynamic masking, RoBERTa
section 4.1), seeded by the samples themselves so that a run is reproducible and resumable.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from vlbert.layers.losses import IGNORE_INDEX, masked_positions  # noqa: F401 (masked_positions: read here by
from vlbert.layers.unpadded import legacy_fields, unpadded_layout

# ../shared/gpu/roofline.py, as before the MLM unit computed the positions itself)
from vlbert.objectives import PrepareContext, units_for
from vlbert.processing.padding import pad_text

IS_NEXT, IS_RANDOM = 0, 1  # next_sentence_label values, as transformers: 0 = B continues A


def truncate_pair(tokens_a: list[int], tokens_b: list[int], max_tokens: int, rng: random.Random) -> None:
    """Shorten the longer segment one token at a time, from the front or back at random, until the pair fits
    (reference ``truncate_seq_pair``: removes position bias from truncation)."""
    while len(tokens_a) + len(tokens_b) > max_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


@dataclass
class MaskingCollator:
    """Pad a list of pretraining items into a batch and apply BERT's masking (dynamic, per batch).

    For each sequence, round(mlm_probability x n) of its n maskable wordpieces (at least one; never [CLS],
    [SEP], [PAD] or other special tokens) are chosen uniformly; of those, 80% are replaced by [MASK], 10% by a
    uniformly random vocabulary id and 10% left unchanged (BERT appendix A.1). ``labels`` holds the original id
    at chosen positions and -100 elsewhere.

    Called on items, it pads them and lets the objective units named in ``objectives`` (text units of
    :data:`vlbert.objectives.OBJECTIVES`; default None: BERT's ``mlm``, and ``nsp`` where the items carry
    ``next_sentence_label``) prepare the batch: MLM masks as
    above (:meth:`choose`, :meth:`corrupt`; other units may choose differently, e.g. whole words) and adds
    ``labels``, NSP adds ``next_sentence_label`` (int64 [B]) from the items. Returns a dict of tensors:
    input_ids, token_type_ids, attention_mask (int64 [B, T]) and the units' labels. T is the longest item rounded
    up to ``pad_to_multiple_of``. With ``unpadded`` (what the training recipes use) also the unpadded layout the model
    then reads instead of the mask (``layout``: :func:`~vlbert.layers.unpadded.unpadded_layout`) and the masking unit's positions (``masked_lm_positions``,
    :func:`~vlbert.layers.losses.masked_positions`): computed here, in the loader workers, so that a training step
    on an accelerator never waits on the host. ``word_continuation``: bool [vocab_size], True for the ids that
    continue a word (WordPiece's ``##`` pieces), read by whole-word masking (:meth:`from_tokenizer` fills it).
    """

    vocab_size: int
    mask_token_id: int
    pad_token_id: int
    special_token_ids: tuple[int, ...]
    mlm_probability: float = 0.15
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1
    pad_to_multiple_of: int = 8
    unpadded: bool = False
    #: the layout under the batch keys of before issue 51 instead (:data:`~vlbert.layers.unpadded.LEGACY_KEYS`),
    #: as ../shared/gpu/roofline.py asks for it (``packed=True``); the recipes use ``unpadded``.
    packed: bool = False
    objectives: tuple[str, ...] | None = None
    word_continuation: torch.Tensor | None = None

    @classmethod
    def from_tokenizer(cls, tokenizer, **kwargs) -> "MaskingCollator":
        """The collator for a Hugging Face tokenizer (its vocabulary size, [MASK], [PAD], special ids and which
        wordpieces continue a word: those spelled ``##...``, WordPiece's convention)."""
        size = len(tokenizer)  # once: transformers recounts the added tokens on every call
        continuation = torch.zeros(size, dtype=torch.bool)
        pieces = [i for token, i in tokenizer.get_vocab().items() if token.startswith("##") and i < size]
        continuation[pieces] = True
        return cls(
            vocab_size=size,
            mask_token_id=tokenizer.mask_token_id,
            pad_token_id=tokenizer.pad_token_id,
            special_token_ids=tuple(tokenizer.all_special_ids),
            word_continuation=continuation,
            **kwargs,
        )

    def __post_init__(self) -> None:
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"mlm_probability must be in (0, 1), got {self.mlm_probability}")
        if self.mask_replace_prob + self.random_replace_prob > 1.0:
            raise ValueError("mask_replace_prob + random_replace_prob must be at most 1")
        text_units(self.objectives or ())  # unknown names fail here, not in a loader worker

    def pad(self, items: list[dict]) -> dict[str, torch.Tensor]:
        """Pad input_ids/token_type_ids to a common length; build attention_mask (see :func:`pad_text`)."""
        return pad_text(items, self.pad_token_id, self.pad_to_multiple_of)

    def maskable(self, input_ids: torch.Tensor) -> torch.Tensor:
        """bool, the shape of ``input_ids``: the positions masking may choose (not special tokens nor padding)."""
        return ~torch.isin(input_ids, torch.tensor(self.special_token_ids + (self.pad_token_id,)))

    def choose(self, input_ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """bool [B, T]: in each row of int64 [B, T] ids, round(mlm_probability x n) of its n maskable wordpieces
        (at least one), chosen uniformly (BERT appendix A.1)."""
        maskable = self.maskable(input_ids)
        n_maskable = maskable.sum(1)
        n_chosen = torch.where(
            n_maskable > 0, (n_maskable.double() * self.mlm_probability).round().clamp(min=1).long(), 0
        )
        scores = torch.rand(input_ids.shape, generator=generator).masked_fill(~maskable, 2.0)
        ranks = scores.argsort(dim=1).argsort(dim=1)
        return ranks < n_chosen[:, None]

    def corrupt(
        self, input_ids: torch.Tensor, chosen: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """BERT's 80/10/10 at the ``chosen`` positions (bool, the shape of ``input_ids``), each drawn on its own:
        [MASK], a uniformly random id, or kept. Returns (masked input_ids, labels: the original id where chosen,
        -100 elsewhere)."""
        labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
        action = torch.rand(input_ids.shape, generator=generator)
        to_mask = chosen & (action < self.mask_replace_prob)
        to_random = (
            chosen & (action >= self.mask_replace_prob) & (action < self.mask_replace_prob + self.random_replace_prob)
        )
        random_ids = torch.randint(self.vocab_size, input_ids.shape, generator=generator)
        masked = torch.where(to_mask, torch.full_like(input_ids, self.mask_token_id), input_ids)
        masked = torch.where(to_random, random_ids, masked)
        return masked, labels

    def mask(
        self, input_ids: torch.Tensor, generator: torch.Generator, choose: Callable | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Apply masking to int64 [B, T] ids: ``choose(input_ids, generator)`` (default :meth:`choose`), then
        :meth:`corrupt`. Returns (masked input_ids, labels)."""
        return self.corrupt(input_ids, (choose or self.choose)(input_ids, generator), generator)

    def mask_rows(
        self,
        input_ids: torch.Tensor,
        generators: list[torch.Generator],
        lengths: list[int],
        choose: Callable | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask each row of a padded int64 [B, T] batch with its own generator over its first ``lengths[i]``
        positions, so a sample's masking does not depend on which other samples share its batch (or rank).
        ``choose``: as :meth:`mask`. Returns (masked input_ids, labels), both int64 [B, T]."""
        input_ids = input_ids.clone()
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        for row, (generator, n) in enumerate(zip(generators, lengths, strict=True)):
            input_ids[row : row + 1, :n], labels[row : row + 1, :n] = self.mask(
                input_ids[row : row + 1, :n], generator, choose
            )
        return input_ids, labels

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        """Pad, then let each unit of :attr:`objectives` prepare the batch (in registry order: a unit that
        reorders the text, SOP, before the masking one); each sample's masking is drawn from its own
        ``mask_seed`` (:meth:`~vlbert.objectives.PrepareContext.masking_generator`). Items carrying
        ``mlm_probability`` (the training loader's tag of a masking schedule's step:
        :class:`~vlbert.data.masking_schedule.MaskingSchedule`) are masked at that rate instead of :attr:`mlm_probability`
        (the first item's: a batch serves one step).

        Raises:
            ValueError: an objective that is not a text unit; items without a unit's fields (e.g. ``nsp`` over
                items without ``next_sentence_label``).
        """
        rate = items[0].get("mlm_probability", self.mlm_probability) if items else self.mlm_probability
        if rate != self.mlm_probability:  # this step's rate of a masking schedule
            return dataclasses.replace(self, mlm_probability=rate)(items)
        batch = self.pad(items)
        context = PrepareContext(self)
        names = (
            self.objectives
            if self.objectives is not None
            else ("mlm", *(("nsp",) if "next_sentence_label" in items[0] else ()))
        )
        for unit in text_units(names):
            unit.prepare(batch, items, context)
        if self.unpadded:
            batch["layout"] = unpadded_layout(batch["attention_mask"])
        elif self.packed:
            batch.update(legacy_fields(batch["attention_mask"]))
        return batch

    @property
    def lays_out(self) -> bool:
        """Whether the batch carries the unpadded layout (:attr:`unpadded` or the legacy :attr:`packed`), and with it
        the masked positions (``masked_lm_positions``)."""
        return self.unpadded or self.packed


def text_units(names) -> list:
    """The text objective units named in ``names``, in registry order (:func:`vlbert.objectives.units_for`).

    Raises:
        ValueError: a name that is not a text unit (unknown, or vision-language only)."""
    units = units_for("text")
    unknown = sorted(set(names) - {unit.name for unit in units})
    if unknown:
        raise ValueError(
            f"{unknown} are not text pretraining objectives; the text objectives are {[unit.name for unit in units]}"
        )
    return [unit for unit in units if unit.name in names]


class LengthGroupedBatchSampler:
    """Shuffled batches of items of similar length, so little padding is computed.

    Items are shuffled (seeded by ``seed`` and the epoch), cut into groups of ``group_size`` global batches,
    sorted by length inside each group and cut into global batches of ``batch_size x world_size`` items; the
    batches are then shuffled. Rank r takes slice r of every global batch (slices differ in size by at most one
    item, none empty), so N processes at ``batch_size`` see exactly the items one process sees at
    ``N x batch_size`` (the basis of DDP equivalence).

    Args:
        lengths: token count of every item.
        batch_size: items per batch per rank.
        seed, epoch: randomness (a new order every epoch).
        group_size: global batches per length-sorting group (1 = no grouping, plain shuffled batches).
        drop_last: drop a final incomplete global batch (always dropped when it cannot give every rank an item).
        rank, world_size: data-parallel position.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        seed: int = 0,
        epoch: int = 0,
        group_size: int = 50,
        drop_last: bool = False,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        self.lengths = np.asarray(lengths)  # numpy throughout: a few bytes per item, whatever the corpus size
        self.batch_size, self.seed, self.epoch = batch_size, seed, epoch
        self.group_size, self.drop_last, self.shuffle = group_size, drop_last, shuffle
        self.rank, self.world_size = rank, world_size

    def global_batches(self) -> list[np.ndarray]:
        """All global batches (``batch_size x world_size`` item indices, int64 arrays) of this epoch, in order."""
        rng = np.random.default_rng(zlib.crc32(f"batches-{self.seed}-{self.epoch}".encode()))
        n = len(self.lengths)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        size = self.batch_size * self.world_size
        group = size * max(1, self.group_size)
        if self.group_size > 1:
            for start in range(0, n, group):
                block = order[start : start + group]
                order[start : start + group] = block[np.argsort(self.lengths[block], kind="stable")]
        batches = [order[j : j + size] for j in range(0, n, size)]
        if batches and (len(batches[-1]) < self.world_size or self.drop_last and len(batches[-1]) < size):
            batches.pop()
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def batches(self) -> list[np.ndarray]:
        """This rank's batches of the epoch, in order: slice ``rank`` of every global batch."""
        # array_split: sizes differ by at most one, so a short last batch still gives every rank an item
        # (global_batches keeps a batch only when it has at least world_size items).
        return [np.array_split(batch, self.world_size)[self.rank] for batch in self.global_batches()]


__all__ = ["truncate_pair", "MaskingCollator", "text_units", "LengthGroupedBatchSampler", "IS_NEXT", "IS_RANDOM"]
