"""The shape of a pretraining objective unit.

A unit owns the three things an objective is made of: how its batch is prepared (the collator side: which
inputs it masks and which labels it adds), its head (built on the model under a fixed attribute name, so
checkpoints keep their key names), and its loss with the number of predictions the loss averages over. Models
run every unit whose labels are in the batch; the collator runs the units the batch's objective names. Adding an
objective is one unit module plus its entry in :data:`vlbert.objectives.OBJECTIVES` and one config line.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn

if TYPE_CHECKING:
    from vlbert.models.inputs import VLInputs
    from vlbert.utils import GatherBounds


@dataclass
class Encoded:
    """What a unit's loss reads from the encoder pass.

    Attributes:
        model: the pretraining model (the units' heads are its attributes, under :attr:`Objective.head`).
        text: float [B, T, H], the text positions of the last layer.
        regions: float [B, R, H] (VL models) or None.
        pooled: float [B, H], the pooled [CLS].
        text_mask, region_mask: [B, T], [B, R], 1 = real position (None: all real).
        hidden_states: the L + 1 hidden states over [text; regions], float [B, T + R, H] each (0 = the
            embeddings), kept when a running unit reads them (:meth:`Objective.reads_hidden_states`); else None.
        word_embeddings: float [vocab_size, H], the input word embedding matrix: the tied decoder weight of the
            masked-LM heads (BERT section 3.1; transformers ties ``cls.predictions.decoder.weight`` to it).
        inputs: the :class:`~vlbert.models.inputs.VLInputs` the encoder was given (after the units'
            :meth:`Objective.before_encoder`), for a unit that runs passes of its own (ITC's unimodal passes); None
            for a text model.
    The joint states (``text``, ``regions``, ``pooled``) are None where no running unit reads them
    (:attr:`Objective.reads_joint`) and the model skipped the joint pass.
    """

    model: nn.Module
    text: torch.Tensor
    regions: torch.Tensor | None
    pooled: torch.Tensor | None
    text_mask: torch.Tensor | None = None
    region_mask: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    word_embeddings: torch.Tensor | None = None
    inputs: VLInputs | None = None


@dataclass
class PrepareContext:
    """What the collator side of a unit needs besides the items: the text masker (``mask_one``/``pad``),
    ``region_mask_probability``, the objective weights (``data.objectives``: a paired unit's loss weight), how ITM
    draws its negatives (``itm_negatives``: "random", "hard" or "itc"), the bounds of any rank's batch
    (``gather_bounds``: a :class:`~vlbert.utils.GatherBounds`, which units that gather the global batch put into
    theirs; None: one process) and each item's own random generator (``generator(item, name)``)."""

    text: Any
    region_mask_probability: float = 0.15
    weights: dict = field(default_factory=dict)
    itm_negatives: str = "random"
    gather_bounds: GatherBounds | None = None

    @staticmethod
    def generator(item: dict, name: str) -> torch.Generator:
        """A generator seeded by the item's ``sample_seed`` (text corpora's items: their ``mask_seed``) and the
        unit's name: a sample's masking depends on
        nothing else (not on its batch or rank), so N processes at batch b = 1 process at N x b."""
        # zlib.crc32, not hash(): str hashes differ between processes (PYTHONHASHSEED), seeds must not.
        sample = item["sample_seed"] if "sample_seed" in item else item.get("mask_seed", 0)  # text corpora: mask_seed
        seed = (int(sample) * 1_000_003 + zlib.crc32(name.encode())) & 0x7FFFFFFFFFFF
        return torch.Generator().manual_seed(seed)

    @classmethod
    def masking_generator(cls, item: dict) -> torch.Generator:
        """The generator the wordpiece-masking units (``mlm``, ``wwm``: one of them per batch) draw an item's
        masking from: seeded by the item's ``mask_seed`` where it carries one (text corpora,
        :class:`~vlbert.data.corpus_pairs.CorpusPairsDataset`), else :meth:`generator` (item, ``"mlm"``)."""
        if "mask_seed" in item:
            return torch.Generator().manual_seed(int(item["mask_seed"]))
        return cls.generator(item, "mlm")


class ObjectiveResult(NamedTuple):
    """A unit's loss (0-d float), its metric (0-d, detached), the number of predictions both average over (an int,
    or a 0-d integer tensor where only the device knows it: ``qa``'s question rows), the
    logits it computed (for the model's output) and further metrics, name -> (0-d value, the count it averages
    over); an entry under the unit's own metric name replaces that metric's count (WRA: its matched pairs).
    ``squares``: where the unit knows its per-prediction values (evaluation only, :func:`item_squares`), the mean
    over the predictions of each one's squared loss and squared metric (two 0-d floats): with the means they give
    the held-out standard error (:func:`vlbert.training.evaluation.evaluate_objectives`); else None."""

    loss: torch.Tensor
    metric: torch.Tensor
    count: int | torch.Tensor
    logits: torch.Tensor | None = None
    extra_metrics: dict | None = None
    squares: tuple[torch.Tensor, torch.Tensor] | None = None


def item_squares(losses: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(mean of ``losses`` ** 2, mean of ``values`` ** 2), both 0-d float32, detached: the second moments of a unit's
    per-prediction losses and metric values (float [N] each; a 0/1 accuracy's are its hits), for
    :attr:`ObjectiveResult.squares`. None while gradients are on (training: nothing is spent on them) or N = 0."""
    if torch.is_grad_enabled() or not losses.numel():
        return None
    losses, values = losses.detach().float(), values.detach().float()
    return (losses * losses).mean(), (values * values).mean()


class Objective:
    """Base class of a pretraining objective unit (see module docstring).

    Class attributes:
        name: the objective's name in configs, logs and ``ObjectiveOutput.losses`` (e.g. ``"mlm"``).
        metric: the name of its metric in ``ObjectiveOutput.metrics`` (e.g. ``"mlm_accuracy"``).
        head: the model attribute holding its head (``"masked_lm"``); units may share a head.
        inputs: the batch keys holding its labels; a model computes the unit when all are given.
        reads: other submodules (dotted names) only this kind of objective uses, e.g. the pooler for ITM; with
            the head they make the unit's footprint, idle when the unit does not run.
        paired_with: None for a unit drawn as a step's objective; else the objective whose batches it also runs
            on (its weight in ``data.objectives`` is then a loss weight, not a frequency: WRA with ITM).
        optional_inputs: batch keys the unit reads when present (the collator's MLM positions, ITM's hard-negative
            keys); with :attr:`inputs` they are the keys the model's ``forward`` takes for the unit.
        modalities: the pretraining models that build the unit: "text" (BertForPreTraining), "vl"
            (VLBertForPreTraining).
        output: the model output field its logits fill (``prediction_logits``, ``seq_relationship_logits``) or
            None.
        chance: the metric of a model that guesses, where the unit's labels fix it (0.5 for NSP, SOP and ITM,
            whose pairs are drawn half positive), else None; the end-of-run table
            (:mod:`vlbert.recipes.report`) compares the held-out metric with it. A unit whose chance depends on the
            batch (ITC: about 1 / the global batch) reports it as a metric ``<metric>_chance`` instead.
        reads_joint: whether the loss reads the joint encoder pass (:attr:`Encoded.text`, ``regions``, ``pooled``,
            ``hidden_states``); a model skips that pass where no running unit does (ITC alone: its own unimodal
            passes).
    """

    name: str = ""
    metric: str = ""
    head: str = ""
    inputs: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    paired_with: str | None = None
    optional_inputs: tuple[str, ...] = ()
    modalities: tuple[str, ...] = ("vl",)
    output: str | None = None
    chance: float | None = None
    reads_joint: bool = True

    def footprint(self) -> tuple[str, ...]:
        """The submodules (dotted names) whose parameters only this unit's loss reaches (a unit without
        parameters, such as WRA, has none)."""
        return tuple(name for name in (self.head, *self.reads) if name)

    def build_head(self, config) -> nn.Module | None:
        """The head module for ``config``, or None: the unit has no head of its own (it uses the head another unit
        builds under the same :attr:`head` name, e.g. SOP NSP's) or cannot run with this config (MRC without
        region classes); a model runs it where a head of that name exists."""
        raise NotImplementedError

    def unsupported(self, config) -> str | None:
        """Why a model of ``config`` cannot run the unit (one line, for the run's configuration check), or None.
        Default: None."""
        return None

    def prepare(self, batch: dict, items: list[dict], ctx: PrepareContext) -> None:
        """Collator side: mask ``batch``'s inputs in place and add this unit's labels (keys :attr:`inputs`)."""
        raise NotImplementedError

    def reads_hidden_states(self, config) -> bool:
        """Whether the loss reads :attr:`Encoded.hidden_states` under ``config`` (the model then keeps them for
        its batches; WRA below the last layer). Default: False."""
        return False

    def before_encoder(self, model: nn.Module, inputs: VLInputs, labels: dict) -> VLInputs:
        """Model side, before the encoder pass of a batch carrying this unit's labels: ``inputs``
        (:class:`~vlbert.models.inputs.VLInputs`) as the unit rewrites them where it builds its examples from the
        model itself (ITM's hard negatives; a new object, ``inputs`` unchanged). Default: ``inputs``."""
        return inputs

    def predict(self, encoded: Encoded) -> torch.Tensor | None:
        """The head's logits without labels (inference), as transformers' ``*ForPreTraining`` return every head's
        logits: what fills :attr:`output` when a forward is given no labels at all. Default: None (no output)."""
        return None

    def loss(self, encoded: Encoded, labels: dict[str, torch.Tensor]) -> ObjectiveResult:
        """The loss from the encoder output and this unit's labels (keys :attr:`inputs`). With no prediction
        the loss is a zero that still depends on the head, so backward reaches every parameter."""
        raise NotImplementedError


__all__ = ["Objective", "ObjectiveResult", "Encoded", "PrepareContext", "item_squares"]
