"""The base of the VL fine-tuning heads: a :class:`~vlbert.models.vl.VLBertModel` and one small head on its
output, trained on the task's targets. A task head says how it reads the encoding (:meth:`VLBertForTask.head`)
and what its loss is (:meth:`VLBertForTask.add_loss`); the forward pass, the target keys' check and the DDP
bookkeeping of modules the task never reads are here once (as transformers' ``*For*`` classes share
``PreTrainedModel``; the heads are UNITER's, section 4)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from vlbert.config import VLBertConfig
from vlbert.models.heads import ClassificationOutput
from vlbert.models.inputs import VL_INPUT_NAMES, VLInputs
from vlbert.models.outputs import EncoderOutput, ObjectiveOutput
from vlbert.models.pretrained import PreTrainedModel
from vlbert.models.vl import VLBertModel


class VLBertForTask(PreTrainedModel):
    """Base class: ``bert`` (:class:`VLBertModel`, the prefix every checkpoint family maps), the head that
    :meth:`build_head` adds, and :meth:`forward`.

    A subclass sets :attr:`label_names` (the batch keys of its targets, which the trainer passes), ``objectives``
    (the loss names it reports), :attr:`output_class`, and :attr:`reads_pooler` (False where the head reads other
    positions than the pooled [CLS]: the pooler then enters the loss with weight zero, as an unused parameter for
    DDP); it implements :meth:`build_head`, :meth:`head` and :meth:`add_loss`, and overrides :meth:`encode` where
    the regions come in another layout (image pairs).
    """

    config_class = VLBertConfig
    base_model_prefix = "bert"
    input_names = VL_INPUT_NAMES
    output_class: ClassVar[type] = ClassificationOutput
    label_names: ClassVar[tuple[str, ...]] = ("labels",)
    reads_pooler: ClassVar[bool] = True

    def __init__(self, config: VLBertConfig):
        super().__init__(config)
        self.bert = VLBertModel(config)
        self.build_head(config)
        self.init_weights()

    def build_head(self, config: VLBertConfig) -> None:
        """Add the head's modules (their names are the checkpoint names)."""
        raise NotImplementedError

    def encode(self, inputs: VLInputs) -> EncoderOutput:
        """The joint encoding [B, T + R, H] of text and regions (:meth:`VLBertModel.forward`); a subclass whose
        regions come in another layout (image pairs) says what its collator's layout describes."""
        return self.bert(inputs)

    def head(self, encoding: EncoderOutput, inputs: VLInputs) -> torch.Tensor:
        """The task's logits from the encoding of ``inputs`` (as given to :meth:`forward`)."""
        raise NotImplementedError

    def add_loss(self, out: ObjectiveOutput, **targets: torch.Tensor) -> None:
        """Add the task's loss and metric to ``out`` (``out.add``), from ``out.logits`` and the given targets."""
        raise NotImplementedError

    def forward(self, inputs: VLInputs | torch.Tensor | None = None, /, **fields) -> ObjectiveOutput:
        """Args: ``inputs``: a :class:`~vlbert.models.inputs.VLInputs` or its fields as keywords (shapes there;
        the class docstring says where a head takes another layout; pixels become features once, in
        :meth:`VLBertModel.with_region_features`); the other keywords: the targets of :attr:`label_names`.
        Returns :attr:`output_class` with ``logits``; with targets, the loss and metric of the task.
        Raises: TypeError for a keyword that is neither an input nor a target the head reads (its keys named);
        ValueError as :meth:`VLBertModel.forward`.
        """
        inputs = VLInputs.take(inputs, fields)
        unknown = sorted(set(fields) - set(self.label_names))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.forward got unknown target(s) {unknown}; it reads {list(self.label_names)}"
            )
        inputs = self.bert.with_region_features(inputs)
        out = self.output_class(logits=self.head(self.encode(inputs), inputs))
        targets = {k: v for k, v in fields.items() if v is not None}
        if targets:
            self.add_loss(out, **targets)
        out.add_unused(*self.idle_modules())
        return out

    def idle_modules(self) -> list[nn.Module]:
        """The submodules a task forward leaves without gradient, declared here once (the trainer applies them under
        DDP): the region pathway's masked-region modules (no regions are masked in fine-tuning) and, for a head that
        reads other positions than the pooled [CLS] (:attr:`reads_pooler` False), the pooler."""
        return [*self.bert.idle_modules(), *(() if self.reads_pooler else (self.bert.pooler,))]


__all__ = ["VLBertForTask"]
