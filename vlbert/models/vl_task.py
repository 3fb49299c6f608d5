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
from vlbert.layers.unpadded import UnpaddedLayout
from vlbert.models.heads import ClassificationOutput
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

    def encode(
        self,
        input_ids,
        token_type_ids,
        attention_mask,
        region_features,
        region_boxes,
        region_mask,
        region_token_type_ids,
        layout: UnpaddedLayout | None = None,
    ) -> EncoderOutput:
        """The joint encoding [B, T + R, H] of text and regions (:meth:`VLBertModel.forward`); ``layout``: the
        collator's unpadded layout of [text ; regions] (a subclass whose regions come in another layout says what
        its collator's layout describes)."""
        return self.bert(
            input_ids,
            token_type_ids,
            attention_mask,
            region_features,
            region_boxes,
            region_mask,
            region_token_type_ids=region_token_type_ids,
            layout=layout,
        )

    def head(
        self,
        encoding: EncoderOutput,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        region_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """The task's logits from the encoding (the text inputs and region mask as given to :meth:`forward`)."""
        raise NotImplementedError

    def add_loss(self, out: ObjectiveOutput, **targets: torch.Tensor) -> None:
        """Add the task's loss and metric to ``out`` (``out.add``), from ``out.logits`` and the given targets."""
        raise NotImplementedError

    def forward(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        region_features=None,
        region_boxes=None,
        region_mask=None,
        region_token_type_ids=None,
        images=None,
        image_sizes=None,
        layout: UnpaddedLayout | None = None,
        **targets,
    ) -> ObjectiveOutput:
        """Args: text int64 [B, T] and regions as :meth:`VLBertModel.forward` (region_features [B, R, D],
        region_boxes float [B, R, 4] normalised xyxy, region_mask [B, R]; the class docstring says where a head
        takes another layout); ``targets``: the keys of :attr:`label_names` (shapes in the class docstring);
        ``layout``: the collator's unpadded layout (:meth:`VLBertModel.forward`);
        ``images``, ``image_sizes``: pixels instead of ``region_features`` for the model's visual backbone
        (:meth:`VLBertModel.extract_regions`).
        Returns :attr:`output_class` with ``logits``; with targets, the loss and metric of the task.
        Raises: TypeError for a target key the head does not read (its keys named); ValueError as
        :meth:`VLBertModel.forward`.
        """
        unknown = sorted(set(targets) - set(self.label_names))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.forward got unknown target(s) {unknown}; it reads {list(self.label_names)}"
            )
        if images is not None:
            region_features = self.bert.extract_regions(images, region_boxes, region_mask, image_sizes)
        enc = self.encode(
            input_ids,
            token_type_ids,
            attention_mask,
            region_features,
            region_boxes,
            region_mask,
            region_token_type_ids,
            layout,
        )
        out = self.output_class(logits=self.head(enc, input_ids, attention_mask, region_mask))
        given = {k: v for k, v in targets.items() if v is not None}
        if given:
            self.add_loss(out, **given)
        out.add_unused(*self.idle_modules())
        return out

    def idle_modules(self) -> list[nn.Module]:
        """The submodules a task forward leaves without gradient, declared here once (the trainer applies them under
        DDP): the region pathway's masked-region modules (no regions are masked in fine-tuning) and, for a head that
        reads other positions than the pooled [CLS] (:attr:`reads_pooler` False), the pooler."""
        return [*self.bert.idle_modules(), *(() if self.reads_pooler else (self.bert.pooler,))]


__all__ = ["VLBertForTask"]
