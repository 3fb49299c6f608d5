"""What VL pretraining's held-out results are judged against: each objective's score when the model predicts the
same thing for every item, a constant fitted on the training split and scored on the held-out batches the run's own
evaluation reads (the same captions, the same masked wordpieces and regions: the masking is seeded per item).

* MLM: the most frequent wordpiece of the training captions (accuracy; the masked targets are a uniform share of
  them) and their unigram distribution, add-one smoothed (the loss: cross-entropy);
* MRC and MRC-kl: the most frequent top class of the training regions (accuracy) and the detector's class prior,
  the mean of the training regions' class distributions (MRC-kl's loss: the KL divergence from it; MRC's
  cross-entropy reads the top classes' add-one smoothed frequencies instead, the constant that minimises it);
* MRFR: the training regions' mean feature (the squared error per dimension, the constant that minimises it);
* ITM: the cross-entropy of the share of matching pairs (``eval_itm_loss_chance``; the accuracy's chance level is
  the unit's :attr:`~vlbert.objectives.base.Objective.chance`, or ``eval_itm_accuracy_chance``).

Keys are the result's with a suffix of :data:`vlbert.recipes.report.BASELINE_SUFFIXES`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn.functional as F
from accelerate.utils import gather_object

from vlbert.layers.losses import IGNORE_INDEX

#: At most this many training images (evenly spaced over the training captions) are read for the region priors.
MAX_PRIOR_IMAGES = 1000


@dataclass
class TrainingPriors:
    """The training split's constants (see the module docstring).

    Attributes:
        token_counts: float64 [V], how often each wordpiece occurs in the training captions (special tokens 0).
        class_prior: float64 [C], the mean class distribution of the training regions, or None (no classes).
        top_class_counts: float64 [C], how often each class is a training region's most likely one, or None.
        mean_feature: float64 [D], the training regions' mean feature, or None (no features: a visual backbone).
    """

    token_counts: torch.Tensor
    class_prior: torch.Tensor | None = None
    top_class_counts: torch.Tensor | None = None
    mean_feature: torch.Tensor | None = None

    def log_class_prior(self) -> torch.Tensor | None:
        """float64 [C], the log of :attr:`class_prior` normalised (each class at least 1e-12 before), or None: the
        constant log-distribution MRC-kl's baseline scores and a new MRC head's bias starts at."""
        if self.class_prior is None:
            return None
        prior = self.class_prior.clamp_min(1e-12)
        return (prior / prior.sum()).log()


def training_priors(train, vocab_size: int, special_ids: Iterable[int], max_images: int = MAX_PRIOR_IMAGES):
    """:class:`TrainingPriors` of ``train`` (a :class:`~vlbert.data.vl_pretraining.VLPretrainingDataset`): the
    wordpieces of every training caption as the model reads them (``train.text_ids``, truncated), and the regions
    (as an item holds them: the first ``max_regions``) of at most ``max_images`` distinct training images, those of
    evenly spaced captions.

    Raises:
        ValueError: no training caption.
    """
    if not len(train):
        raise ValueError("the training split has no caption to fit the baselines on")
    ids = torch.tensor([t for c in train.captions for t in train.text_ids(c)], dtype=torch.long)
    counts = torch.bincount(ids, minlength=vocab_size).double()
    counts[list(special_ids)] = 0
    step = max(1, len(train) // max_images)
    images = list(dict.fromkeys(c.image_id for c in train.captions[::step]))[:max_images]
    items = [train.processor.region_item(train.regions[i]) for i in images]
    feats = [torch.as_tensor(x["region_features"]).double() for x in items if x.get("region_features") is not None]
    probs = [torch.as_tensor(x["class_probs"]).double() for x in items if x.get("class_probs") is not None]
    classes = torch.cat(probs) if probs and len(probs) == len(items) else None
    return TrainingPriors(
        counts,
        classes.mean(0) if classes is not None else None,
        torch.bincount(classes.argmax(-1), minlength=classes.shape[1]).double() if classes is not None else None,
        torch.cat(feats).mean(0) if feats and len(feats) == len(items) else None,
    )


def _add(sums: dict, key: str, values: torch.Tensor) -> None:
    """Add the per-prediction ``values`` (float [N]) to ``sums[key]`` = [sum, count]."""
    total = sums.setdefault(key, [0.0, 0])
    total[0] += float(values.double().sum())
    total[1] += values.numel()


def _mlm(sums: dict, batch: dict, priors: TrainingPriors) -> None:
    targets = batch["labels"][batch["labels"] != IGNORE_INDEX]
    unigram = (priors.token_counts + 1) / (priors.token_counts.sum() + len(priors.token_counts))
    _add(sums, "eval_mlm_accuracy_majority_baseline", (targets == priors.token_counts.argmax()).double())
    _add(sums, "eval_mlm_loss_unigram_baseline", -unigram.log()[targets])


def _mrc_kl(sums: dict, batch: dict, priors: TrainingPriors) -> None:
    target = batch["region_labels"].double()
    target = target.reshape(-1, target.shape[-1])[batch["masked_regions"].reshape(-1)] if target.dim() == 3 else target
    log_prior = priors.log_class_prior().expand_as(target)  # as the unit's KL, per region
    _add(
        sums, "eval_mrc_kl_accuracy_majority_baseline", (target.argmax(-1) == priors.top_class_counts.argmax()).double()
    )
    _add(sums, "eval_mrc_kl_loss_class_prior_baseline", F.kl_div(log_prior, target, reduction="none").sum(-1))


def _mrc(sums: dict, batch: dict, priors: TrainingPriors) -> None:
    labels = batch["region_class_labels"][batch["region_class_labels"] != IGNORE_INDEX]
    counts = priors.top_class_counts
    frequency = (counts + 1) / (counts.sum() + len(counts))
    _add(sums, "eval_mrc_accuracy_majority_baseline", (labels == counts.argmax()).double())
    _add(sums, "eval_mrc_loss_class_prior_baseline", -frequency.log()[labels])


def _mrfr(sums: dict, batch: dict, priors: TrainingPriors) -> None:
    target = batch["region_targets"]
    if not target.is_floating_point():  # the collator's: positions into the batch's features
        features = batch["region_features"]
        target = features.reshape(-1, features.shape[-1]).index_select(0, target)
    errors = ((target.double() - priors.mean_feature) ** 2).mean(-1)  # each region's, as the unit's mean
    _add(sums, "eval_mrfr_loss_mean_feature_baseline", errors)
    _add(sums, "eval_mrfr_mse_mean_feature_baseline", errors)


#: objective -> (what it needs of the priors, what adds its baselines)
_UNITS = {
    "mlm": ("token_counts", _mlm),
    "mrc_kl": ("class_prior", _mrc_kl),
    "mrc": ("top_class_counts", _mrc),
    "mrfr": ("mean_feature", _mrfr),
}


def held_out_baselines(batches: Iterable[dict], priors: TrainingPriors) -> dict[str, float]:
    """The baselines of the held-out ``batches`` (this process's share of the run's held-out batches, each of one
    ``objective``; every process calls this, the sums are gathered): for each of ``mlm``, ``mrc_kl``, ``mrc``,
    ``mrfr`` whose batches come and whose prior exists, the mean over the predictions its metric averages of the
    constant's score (float). Other objectives' batches add nothing."""
    sums: dict[str, list] = {}
    for batch in batches:
        need, add = _UNITS.get(batch.get("objective"), (None, None))
        if add is not None and getattr(priors, need) is not None:
            add(sums, batch, priors)
    totals: dict[str, list] = {}
    for part in gather_object([sums]):
        for key, (value, n) in part.items():
            total = totals.setdefault(key, [0.0, 0])
            total[0], total[1] = total[0] + value, total[1] + n
    return {key: value / n for key, (value, n) in sorted(totals.items()) if n}


def itm_loss_chance(negatives: str) -> float:
    """The ITM cross-entropy (nats) of predicting the share of matching pairs for every pair: ln 2 where half the
    pairs match (``random``, ``hard``), the binary entropy of 1/3 where a pair comes with two negatives (``itc``:
    :mod:`vlbert.objectives.image_text_matching`)."""
    p = 1 / 3 if negatives == "itc" else 0.5
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


__all__ = ["TrainingPriors", "training_priors", "held_out_baselines", "itm_loss_chance", "MAX_PRIOR_IMAGES"]
