"""Image-text matching (UNITER section 3.2): half of the images keep their own caption (label 1), the other
half get a caption of another image whose content differs (label 0); cross-entropy on the pooled [CLS]."""

from __future__ import annotations

import torch
from torch import nn

from vlbert.layers.losses import classification_loss
from vlbert.objectives.base import Encoded, Objective, ObjectiveResult, PrepareContext


class ImageTextMatching(Objective):
    """``itm_label`` int64 [B] (1 = the text belongs to the image). Items carry ``negative_input_ids``, a
    caption of another image with different content (the dataset guarantees it)."""

    name, metric, head, inputs = "itm", "itm_accuracy", "itm", ("itm_label",)
    reads = ("bert.pooler",)

    def build_head(self, config) -> nn.Linear:
        return nn.Linear(config.hidden_size, 2)

    def prepare(self, batch: dict, items: list[dict], ctx: PrepareContext) -> None:
        is_match = [bool(torch.rand(1, generator=ctx.generator(x, self.name)) < 0.5) for x in items]
        batch.update(ctx.text.pad([{"input_ids": x["input_ids"] if m else x["negative_input_ids"]}
                                   for x, m in zip(items, is_match)]))
        batch["itm_label"] = torch.tensor(is_match, dtype=torch.long)

    def loss(self, encoded: Encoded, labels) -> ObjectiveResult:
        logits = getattr(encoded.model, self.head)(encoded.pooled)
        loss, accuracy, n = classification_loss(logits, labels["itm_label"])
        return ObjectiveResult(loss, accuracy, n, logits)


__all__ = ["ImageTextMatching"]
