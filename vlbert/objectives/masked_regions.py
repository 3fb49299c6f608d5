"""Masked region modelling (UNITER section 3.2): 15% of an image's real regions (at least one) have their
features zeroed while the caption stays intact, and the model recovers them from the rest:

* MRFR: regress the original RoI feature (mean squared error over masked regions and feature dimensions);
* MRC: classify the region as the detector's most likely class (cross-entropy);
* MRC-kl: match the detector's whole class distribution (KL divergence).

The class distribution never includes a background class: detectors and importers leave it out (see
:mod:`vlbert.detectors.torchvision_detector`), as UNITER's targets do.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from vlbert.layers.losses import upcast
from vlbert.layers.pretraining_heads import RegionHead
from vlbert.objectives.base import Encoded, Objective, ObjectiveResult, PrepareContext, item_squares
from vlbert.objectives.region_targets import masked_class_probs, pad_class_probs


def choose_masked_regions(
    num_real: int, num_regions: int, probability: float, generator: torch.Generator
) -> torch.Tensor:
    """bool [num_regions]: round(probability x num_real) of the first ``num_real`` (real) regions, at least one,
    chosen uniformly (UNITER section 3.2: 15% of regions, features zeroed)."""
    n_chosen = max(1, round(num_real * probability))
    chosen = torch.zeros(num_regions, dtype=torch.bool)
    chosen[torch.randperm(num_real, generator=generator)[:n_chosen]] = True
    return chosen


class _MaskedRegions(Objective):
    """Shared collator side: choose each image's masked regions from its own generator (``masked_regions``, and
    their flat positions); subclasses add their targets. The features travel as they are: the model zeroes the
    masked regions' features on the device (:meth:`~vlbert.models.vl.VLBertModel.with_region_features`; a batch of
    images for a visual backbone: their pixels), so MRFR's targets are gathered there from the features the batch
    already sends. The model's region pathway may add a learned mask embedding there (UNITER's
    ``mask_embedding``), which only these units reach: the pathway declares it
    (``RegionEmbedding.masked_region_modules``), the model keeps it idle on other batches."""

    optional_inputs = ("masked_region_positions",)

    def prepare(self, batch: dict, items: list[dict], ctx: PrepareContext) -> None:
        region_mask = batch["region_mask"]
        masked = torch.stack(
            [
                choose_masked_regions(
                    int(region_mask[i].sum()),
                    region_mask.shape[1],
                    ctx.region_mask_probability,
                    ctx.generator(x, self.name),
                )
                for i, x in enumerate(items)
            ]
        )
        batch["masked_regions"] = masked
        # their flat positions, found here on the host: selecting them in the step needs no host sync
        batch["masked_region_positions"] = masked.reshape(-1).nonzero().squeeze(1)
        self.add_targets(batch, items, masked)

    def add_targets(self, batch: dict, items: list[dict], masked: torch.Tensor) -> None:
        raise NotImplementedError

    def selected(self, encoded: Encoded, labels) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
        """(the masked regions' final states [M, H], a function taking a [B, R, ...] label tensor to its masked
        rows [M, ...]), in row order. The rows come from ``masked_region_positions`` (int64 [M], row * R +
        region, the collator's) or, without them, from ``masked_regions`` (one ``nonzero``: a host sync)."""
        positions = labels.get("masked_region_positions")
        if positions is None:
            positions = labels["masked_regions"].reshape(-1).nonzero().squeeze(1)

        def take(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(-1, *t.shape[2:]).index_select(0, positions)

        return take(encoded.regions), take


def masked_rows(target: torch.Tensor, take: Callable[[torch.Tensor], torch.Tensor], rank: int) -> torch.Tensor:
    """The masked regions' rows of a target: ``take(target)`` for a padded [B, R, ...] one (``rank`` dimensions),
    ``target`` itself when it holds the masked rows already ([M, ...], one dimension less: the collator's)."""
    return take(target) if target.dim() == rank else target


class MaskedRegionFeatureRegression(_MaskedRegions):
    """``masked_regions`` bool [B, R] and ``region_targets``: int64 [M], the masked regions' flat positions (row x R
    + region) in the batch's own ``region_features`` as given, before the model zeroes them (the collator's: the
    targets are gathered on the device from the features already sent, nothing travels twice); or float, the
    masked regions' features [M, D] in ``masked_region_positions`` order, or every region's [B, R, D].

    Raises (loss): ValueError for positions without given ``region_features`` (pixels for a visual backbone)."""

    name, metric, head, inputs = "mrfr", "mrfr_mse", "mrfr", ("masked_regions", "region_targets")

    def build_head(self, config) -> RegionHead:
        return RegionHead(config, config.region_feature_dim)

    def add_targets(self, batch, items, masked) -> None:
        batch["region_targets"] = batch["masked_region_positions"]

    def loss(self, encoded: Encoded, labels) -> ObjectiveResult:
        hidden, take = self.selected(encoded, labels)
        pred = upcast(getattr(encoded.model, self.head)(hidden))
        target = labels["region_targets"]
        if target.is_floating_point():
            target = masked_rows(target, take, 3)
        else:  # positions into the features as given (the model passes them unzeroed: ``region_features``)
            features = labels.get("region_features")
            if features is None:
                raise ValueError(
                    "mrfr regresses the given region_features at region_targets' positions, but the batch has "
                    "none (pixels for a visual backbone); give region features or drop the mrfr objective"
                )
            target = features.reshape(-1, features.shape[-1]).index_select(0, target)
        target = target.to(pred.dtype)
        loss = F.mse_loss(pred, target) if len(pred) else pred.sum() * 0.0
        squares = None
        if not torch.is_grad_enabled():  # held out: each masked region's squared error, the loss's items
            regions = ((pred.detach() - target) ** 2).mean(-1)
            squares = item_squares(regions, regions)
        return ObjectiveResult(loss, loss.detach(), len(pred), squares=squares)


class MaskedRegionClassification(_MaskedRegions):
    """MRC: ``masked_regions`` and ``region_class_labels`` int64 [B, R] (the detector's top class at masked
    regions, -100 elsewhere)."""

    name, metric, head, inputs = "mrc", "mrc_accuracy", "mrc", ("masked_regions", "region_class_labels")
    #: the region items' distribution whose top class is the target, the batch key of the targets, and the config
    #: field that sizes the head (LXMERT's attribute unit sets its own: vlbert.objectives.lxmert_units).
    probs_key, labels_key, classes_field = "class_probs", "region_class_labels", "num_region_classes"

    def build_head(self, config) -> RegionHead | None:
        classes = getattr(config, self.classes_field, 0)
        return RegionHead(config, classes) if classes else None

    def add_targets(self, batch, items, masked) -> None:
        top = pad_class_probs(items, masked.shape[1], self.probs_key).float().argmax(-1)
        batch[self.labels_key] = top.masked_fill(~masked, -100)

    def loss(self, encoded: Encoded, labels) -> ObjectiveResult:
        hidden, take = self.selected(encoded, labels)
        logits = upcast(getattr(encoded.model, self.head)(hidden))
        target = take(labels[self.labels_key])
        if not len(target):
            zero = logits.sum() * 0.0
            return ObjectiveResult(zero, zero.detach(), 0)
        loss = F.cross_entropy(logits, target)
        hits = logits.detach().argmax(-1) == target
        squares = None
        if not torch.is_grad_enabled():  # held out: each masked region's cross-entropy and hit
            squares = item_squares(F.cross_entropy(logits.detach(), target, reduction="none"), hits)
        return ObjectiveResult(loss, hits.float().mean(), len(target), logits, squares=squares)


class MaskedRegionClassificationKL(_MaskedRegions):
    """MRC-kl: ``masked_regions`` and ``region_labels`` float: the detector's class distribution of the masked
    regions [M, C] in ``masked_region_positions`` order (the collator's, float16), or of every region [B, R, C];
    the metric is top-1 agreement with the detector."""

    name, metric, head, inputs = "mrc_kl", "mrc_kl_accuracy", "mrc", ("masked_regions", "region_labels")

    def build_head(self, config) -> RegionHead | None:
        return RegionHead(config, config.num_region_classes) if config.num_region_classes else None

    def add_targets(self, batch, items, masked) -> None:
        batch["region_labels"] = masked_class_probs(items, masked)

    def loss(self, encoded: Encoded, labels) -> ObjectiveResult:
        hidden, take = self.selected(encoded, labels)
        logits = upcast(getattr(encoded.model, self.head)(hidden))
        target = masked_rows(labels["region_labels"], take, 3).to(logits.dtype)
        if not len(target):
            zero = logits.sum() * 0.0
            return ObjectiveResult(zero, zero.detach(), 0)
        loss = F.kl_div(F.log_softmax(logits, -1), target, reduction="batchmean")
        hits = logits.detach().argmax(-1) == target.argmax(-1)
        squares = None
        if not torch.is_grad_enabled():  # held out: each masked region's KL and hit
            regions = F.kl_div(F.log_softmax(logits.detach(), -1), target, reduction="none").sum(-1)
            squares = item_squares(regions, hits)
        return ObjectiveResult(loss, hits.float().mean(), len(target), logits, squares=squares)


__all__ = [
    "choose_masked_regions",
    "masked_rows",
    "MaskedRegionFeatureRegression",
    "MaskedRegionClassification",
    "MaskedRegionClassificationKL",
]
