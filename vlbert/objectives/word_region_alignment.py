"""Word-region alignment (UNITER section 3.2; ChenRocks/UNITER ``model/pretrain.py`` ``forward_itm`` and
``pretrain.py`` at 1dbfa62): on the image-text matching batch, the optimal-transport distance between the
contextual embeddings of a pair's words (all its text positions, [CLS] and [SEP] included, as UNITER) and of its
regions, under the cosine cost (:func:`vlbert.layers.optimal_transport.wasserstein_distance`: IPOT, beta 0.5, 50
iterations, float32). Matched pairs' distances are minimised and mismatched pairs' maximised:

    loss = lambda * (sum of matched distances - sum of mismatched distances) / pairs

added to the ITM loss of the same batch (UNITER: ``itm_ot_lambda`` = 0.1). WRA has no parameters and is never
drawn on its own: its weight in ``data.objectives`` is lambda, and it runs on every ``itm`` batch.

Which states it transports between is the model's ``config.wra_layer`` (:func:`alignment_states`): the last
layer's, as UNITER, by default; the embeddings (0) or another layer's output on request.
"""

from __future__ import annotations

import torch

from vlbert.layers.optimal_transport import wasserstein_distance
from vlbert.objectives.base import Encoded, Objective, ObjectiveResult, PrepareContext


def below_last_layer(config) -> bool:
    """Whether ``config.wra_layer`` names states below the last layer (-1 and L name the last)."""
    return getattr(config, "wra_layer", -1) not in (-1, config.num_hidden_layers)


def alignment_states(
    config, text: torch.Tensor, regions: torch.Tensor, hidden_states: tuple[torch.Tensor, ...] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The word and region states WRA transports between: ``config.wra_layer``'s.

    Args:
        config: the model's :class:`vlbert.VLBertConfig` (``wra_layer``: -1 = the last layer, 0 = the embeddings,
            k = layer k's output).
        text, regions: float [B, T, H], [B, R, H], the last layer's text and region positions.
        hidden_states: the encoder's L + 1 hidden states over [text; regions] ([B, T + R, H] each), or None when
            the last layer is the one asked for.
    Returns:
        (words [B, T, H], regions [B, R, H]).
    Raises:
        ValueError: another layer is asked for and ``hidden_states`` is None.
    """
    if not below_last_layer(config):
        return text, regions
    layer = config.wra_layer
    if hidden_states is None:
        raise ValueError(
            f"config.wra_layer={layer} needs the encoder's hidden states: run it with output_hidden_states=True"
        )
    t = text.shape[1]
    return hidden_states[layer][:, :t], hidden_states[layer][:, t:]


class WordRegionAlignment(Objective):
    """``itm_label`` int64 [B] (1 = matched) and ``wra_weight`` float [] (lambda); metrics: the mean distance of
    matched pairs (``wra_matched_distance``) and of mismatched ones (``wra_mismatched_distance``)."""

    name, metric, head, inputs = "wra", "wra_matched_distance", "", ("itm_label", "wra_weight")
    paired_with = "itm"
    beta, iterations = 0.5, 50

    def build_head(self, config) -> None:
        return None

    def reads_hidden_states(self, config) -> bool:
        return below_last_layer(config)

    def prepare(self, batch: dict, items: list[dict], ctx: PrepareContext) -> None:
        batch["wra_weight"] = torch.tensor(float(ctx.weights.get(self.name, 0.0)))

    def loss(self, encoded: Encoded, labels) -> ObjectiveResult:
        words, regions = alignment_states(encoded.model.config, encoded.text, encoded.regions, encoded.hidden_states)
        distance, plan = wasserstein_distance(
            words, regions, encoded.text_mask, encoded.region_mask, self.beta, self.iterations
        )
        matched = labels["itm_label"].bool()
        b = len(distance)
        # masked sums, not boolean indexing (each index is a host synchronisation)
        loss = labels["wra_weight"].float() * torch.where(matched, distance, -distance).sum() / b
        with torch.no_grad():  # means over the pairs of each kind (0 where a batch has none, with count 0)
            n_matched = int(matched.sum())  # the one host read: the metrics' counts are host ints
            n_mismatched = b - n_matched
            metric = (distance * matched).sum() / max(n_matched, 1)
            extra = {
                self.metric: (metric, n_matched),
                "wra_mismatched_distance": ((distance * ~matched).sum() / max(n_mismatched, 1), n_mismatched),
            }
        return ObjectiveResult(loss, metric, b, plan, extra)


__all__ = ["WordRegionAlignment", "alignment_states", "below_last_layer"]
