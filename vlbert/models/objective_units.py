"""The one unit loop every pretraining model shares: build the heads of the objective units registered for its
modality (:func:`vlbert.objectives.units_for`), run each unit whose labels a batch carries, and fill the output
(losses, metrics, counts, the units' output fields) as transformers' ``*ForPreTraining`` do.

:class:`~vlbert.models.bert.BertForPreTraining` ("text") and :class:`~vlbert.models.vl.VLBertForPreTraining`
("vl") are its two users: a unit added to :data:`~vlbert.objectives.OBJECTIVES` with its modality is built and
run by them with no edit here.
"""

from __future__ import annotations

from torch import nn

from vlbert.models.outputs import PreTrainingOutput
from vlbert.models.pretrained import PreTrainedModel
from vlbert.objectives import Encoded, Objective, units_for


class UnitPreTrainingModel(PreTrainedModel):
    """Base of the pretraining models: :attr:`modality` names the units it builds (:meth:`build_units`, from its
    ``__init__`` before ``init_weights``); :meth:`run_units` computes them. Each unit's head is an attribute
    named by :attr:`Objective.head` (checkpoint keys), shared by units that name the same head (MLM and
    whole-word masking: ``masked_lm``; NSP and SOP: ``next_sentence``; MRC and MRC-kl: ``mrc``); a unit whose
    head does not exist (its ``build_head`` returned None: MRC without region classes) is left out."""

    modality: str = ""

    def build_units(self, config) -> None:
        """Build the heads of ``units_for(self.modality)`` on this model, in registry order (a head another unit
        already built is not built again; a unit that only uses another's head builds none), and keep the units
        whose head exists (or that have none)."""
        units = units_for(self.modality)
        for unit in units:
            if unit.head and getattr(self, unit.head, None) is None:
                head = unit.build_head(config)
                if head is not None:
                    setattr(self, unit.head, head)
        self.units: list[Objective] = [u for u in units if not u.head or getattr(self, u.head, None) is not None]

    @property
    def objectives(self) -> tuple[str, ...]:
        """The names of the units this model runs (fixed order: multi-process loss weighting)."""
        return tuple(unit.name for unit in self.units)

    @property
    def label_names(self) -> tuple[str, ...]:
        """The batch keys the units read (``forward``'s ``**labels``): what the trainer passes besides the inputs."""
        return tuple(dict.fromkeys(k for u in self.units for k in (*u.inputs, *u.optional_inputs)))

    def given_labels(self, labels: dict, **extra) -> dict:
        """Every label name -> its tensor or None, with ``extra`` inputs units also read (``masked_regions``).

        Raises:
            TypeError: a key no unit reads (a misspelt label would otherwise train nothing)."""
        unknown = sorted(set(labels) - set(self.label_names))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.forward got {unknown}, which no objective unit reads; the units "
                f"read {list(self.label_names)}"
            )
        return {**dict.fromkeys(self.label_names), **labels, **extra}

    def running(self, given: dict) -> list[Objective]:
        """The units whose labels (:attr:`Objective.inputs`) are all given."""
        return [unit for unit in self.units if all(given.get(k) is not None for k in unit.inputs)]

    def run_units(self, out: PreTrainingOutput, encoded: Encoded, given: dict) -> PreTrainingOutput:
        """Add each running unit's loss, metric, count and logits (its :attr:`Objective.output` field) to
        ``out``. Without labels (inference) every head with an output field fills it (:meth:`Objective.predict`).
        While gradients are on, :meth:`idle_modules` are declared in ``unused_parameters`` (the trainer applies them
        under DDP: :class:`~vlbert.training.idle.IdleParameters`)."""
        for unit in self.running(given):
            result = unit.loss(encoded, given)
            out.add(unit.name, result.loss, unit.metric, result.metric, result.count)
            if result.squares is not None:
                out.squares[unit.name], out.squares[unit.metric] = result.squares
            for metric, (value, count) in (result.extra_metrics or {}).items():
                out.metrics[metric], out.counts[metric] = value, count
            if unit.output:
                setattr(out, unit.output, result.logits)
        if out.loss is None:  # inference (no labels): every head's logits, as transformers' *ForPreTraining
            for unit in self.units:
                if unit.output and getattr(out, unit.output) is None:
                    setattr(out, unit.output, unit.predict(encoded))
        out.add_unused(*self.idle_modules(given))  # nothing without a loss
        return out

    def idle_modules(self, given: dict) -> list[nn.Module]:
        """The submodules a forward on ``given`` (:meth:`given_labels`) leaves without gradient, declared here once:
        the heads (and :attr:`Objective.reads`) of the units that do not run, then the encoder's own
        (:meth:`~vlbert.models.vl.VLBertModel.idle_modules`: a region pathway's masked-region modules)."""
        used = {name for unit in self.running(given) for name in unit.footprint()}
        footprints = dict.fromkeys(name for u in self.units for name in u.footprint())
        idle = [self.get_submodule(n) for n in footprints if n not in used and _has_submodule(self, n)]
        return idle + self.bert.idle_modules(given.get("masked_regions"))


def _has_submodule(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
        return True
    except AttributeError:
        return False


__all__ = ["UnitPreTrainingModel"]
