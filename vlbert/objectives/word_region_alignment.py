"""Word-region alignment (UNITER section 3.2; ChenRocks/UNITER ``model/pretrain.py`` ``forward_itm`` and
``pretrain.py`` at 1dbfa62): on the image-text matching batch, the optimal-transport distance between the
contextual embeddings of a pair's words (all its text positions, [CLS] and [SEP] included, as UNITER) and of its
regions, under the cosine cost (:func:`vlbert.layers.optimal_transport.wasserstein_distance`: IPOT, beta 0.5, 50
iterations, float32). Matched pairs' distances are minimised and mismatched pairs' maximised:

    loss = lambda * (sum of matched distances - sum of mismatched distances) / pairs

added to the ITM loss of the same batch (UNITER: ``itm_ot_lambda`` = 0.1). WRA has no parameters and is never
drawn on its own: its weight in ``data.objectives`` is lambda, and it runs on every ``itm`` batch.
"""

from __future__ import annotations

import torch

from vlbert.layers.optimal_transport import wasserstein_distance
from vlbert.objectives.base import Encoded, Objective, ObjectiveResult, PrepareContext


class WordRegionAlignment(Objective):
    """``itm_label`` int64 [B] (1 = matched) and ``wra_weight`` float [] (lambda); metrics: the mean distance of
    matched pairs (``wra_matched_distance``) and of mismatched ones (``wra_mismatched_distance``)."""

    name, metric, head, inputs = "wra", "wra_matched_distance", "", ("itm_label", "wra_weight")
    paired_with = "itm"
    beta, iterations = 0.5, 50

    def build_head(self, config) -> None:
        return None

    def prepare(self, batch: dict, items: list[dict], ctx: PrepareContext) -> None:
        batch["wra_weight"] = torch.tensor(float(ctx.weights.get(self.name, 0.0)))

    def loss(self, encoded: Encoded, labels) -> ObjectiveResult:
        distance, plan = wasserstein_distance(encoded.text, encoded.regions, encoded.text_mask, encoded.region_mask,
                                              self.beta, self.iterations)
        matched = labels["itm_label"].bool()
        b = len(distance)
        loss = labels["wra_weight"].float() * (distance[matched].sum() - distance[~matched].sum()) / b
        with torch.no_grad():  # means over the pairs of each kind (0 where a batch has none, with count 0)
            n_matched, n_mismatched = int(matched.sum()), int((~matched).sum())
            metric = distance[matched].sum() / max(n_matched, 1)
            extra = {"wra_mismatched_distance": (distance[~matched].sum() / max(n_mismatched, 1), n_mismatched)}
        return ObjectiveResult(loss, metric, b, plan, extra, metric_count=n_matched)


__all__ = ["WordRegionAlignment"]
