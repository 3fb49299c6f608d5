"""Attention pictures (PNG files a person looks at): per-layer, per-head maps over wordpieces and each head's
average attention to [CLS], [SEP], the previous and the next token (Clark et al. 2019, "What does BERT look at?",
sections 3-4); for an image + caption, the regions' boxes on the image shaded by the attention a word gives them,
and the text-to-region attention as a heat map.
"""

from __future__ import annotations

import numpy as np
import torch

from vlbert.layers.optimal_transport import wasserstein_distance
from vlbert.objectives.word_region_alignment import alignment_states, below_last_layer


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def head_statistics(
    attentions: tuple[torch.Tensor, ...],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    cls_id: int,
    sep_id: int,
) -> dict[str, np.ndarray]:
    """Each head's average attention (over real query tokens) to [CLS], to [SEP], to the previous and to the next
    token (Clark et al. 2019, figure 2).

    Args:
        attentions: L tensors [B, heads, T, T] (``output_attentions=True``).
        input_ids, attention_mask: int [B, T].
    Returns:
        {"cls", "sep", "previous", "next"}: float [L, heads] each.
    """
    real = attention_mask.bool()
    n = real.sum()
    is_cls, is_sep = (input_ids == cls_id) & real, (input_ids == sep_id) & real
    out = {k: [] for k in ("cls", "sep", "previous", "next")}
    for probs in attentions:
        p = probs.float() * real[:, None, :, None]  # real queries only
        out["cls"].append((p * is_cls[:, None, None, :]).sum((0, 2, 3)) / n)
        out["sep"].append((p * is_sep[:, None, None, :]).sum((0, 2, 3)) / n)
        out["previous"].append(p.diagonal(-1, 2, 3).sum((0, 2)) / n)
        out["next"].append(p.diagonal(1, 2, 3).sum((0, 2)) / n)
    return {k: torch.stack(v).numpy() for k, v in out.items()}


def plot_head_statistics(stats: dict[str, np.ndarray], path) -> None:
    """Four heat maps (layer x head) of :func:`head_statistics` in one PNG."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(12, 2.8), dpi=110, layout="constrained")
    for ax, (name, values) in zip(axes, stats.items(), strict=True):
        image = ax.imshow(values, vmin=0, vmax=1, cmap="viridis")
        ax.set_title(f"attention to {name}", fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(values.shape[1]))
        ax.set_yticks(range(values.shape[0]))
        ax.tick_params(labelsize=6)
    fig.colorbar(image, ax=axes, shrink=0.8)
    fig.savefig(path)
    plt.close(fig)


def plot_text_attention(attentions: tuple[torch.Tensor, ...], tokens: list[str], path, layers=None) -> None:
    """A grid of heat maps, one per (layer, head), of one sequence's attention (rows: queries, columns: keys).

    Args:
        attentions: L tensors [1, heads, T, T] for one sequence (padding removed).
        tokens: the T wordpieces (axis labels).
        layers: which layers (default all).
    """
    plt = _pyplot()
    layers = list(range(len(attentions))) if layers is None else list(layers)
    heads = attentions[0].shape[1]
    fig, axes = plt.subplots(len(layers), heads, figsize=(1.6 * heads, 1.6 * len(layers)), dpi=110, squeeze=False)
    for r, layer in enumerate(layers):
        for h in range(heads):
            ax = axes[r][h]
            ax.imshow(attentions[layer][0, h].float().numpy(), vmin=0, vmax=1, cmap="Blues")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"head {h}", fontsize=7)
            if h == 0:
                ax.set_ylabel(f"layer {layer + 1}", fontsize=7)
    if len(tokens) <= 24:  # label the first map's axes with the wordpieces
        ax = axes[0][0]
        ax.set_xticks(range(len(tokens)))
        ax.set_xticklabels(tokens, rotation=90, fontsize=4)
        ax.set_yticks(range(len(tokens)))
        ax.set_yticklabels(tokens, fontsize=4)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def word_region_attention(
    attentions: tuple[torch.Tensor, ...], num_text: int, layer: int, head: int | None = None, cross: bool = False
) -> np.ndarray:
    """float [T, R]: the attention each text position gives each region in ``layer`` (averaged over heads, or
    one ``head``), renormalised over the regions so rows compare across words. Sequence order: text then regions
    (as :class:`vlbert.VLBertModel`). ``cross``: ``attentions`` are a two-stream model's ``cross_attentions``
    ([1, heads, T, R] per cross-modality layer: the text queries over the regions, LXMERT), read as they are."""
    probs = attentions[layer][0].float()
    probs = probs.mean(0) if head is None else probs[head]
    to_regions = probs if cross else probs[:num_text, num_text:]
    return (to_regions / to_regions.sum(-1, keepdim=True).clamp(min=1e-12)).numpy()


def word_region_transport(
    model, input_ids: torch.Tensor, regions: dict[str, torch.Tensor], beta: float = 0.5, iterations: int = 50
) -> tuple[np.ndarray, float]:
    """UNITER's word-region alignment of one pair: the optimal transport plan between its words and its regions
    (:func:`vlbert.layers.optimal_transport.wasserstein_distance` between the word and region states of the
    model's ``config.wra_layer``, the last layer's by default, as the ``wra`` objective computes it), each word's
    row renormalised over the regions so rows compare across words (as :func:`word_region_attention`), and the
    pair's transport distance.

    Args:
        model: a :class:`vlbert.VLBertForPreTraining` (or anything whose ``bert`` is a :class:`vlbert.VLBertModel`).
        input_ids: int64 [1, T]; regions: ``pad_regions`` of one item (region_features [1, R, D], region_boxes,
            region_mask).
    Returns:
        (float [T, R] share of each word's mass per region; the distance, a float in [0, 2]).
    """
    config = model.bert.config
    with torch.no_grad():
        out = model.bert(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            **regions,
            output_hidden_states=below_last_layer(config),
        )
        t = input_ids.shape[1]
        words, region_states = alignment_states(
            config, out.last_hidden_state[:, :t], out.last_hidden_state[:, t:], out.hidden_states
        )
        distance, plan = wasserstein_distance(
            words, region_states, torch.ones_like(input_ids), regions["region_mask"], beta, iterations
        )
    rows = plan[0]
    return (rows / rows.sum(-1, keepdim=True).clamp(min=1e-12)).numpy(), float(distance[0])


def plot_word_regions(
    image,
    boxes: np.ndarray,
    tokens: list[str],
    word_region: np.ndarray,
    word: int,
    region_labels: list[str],
    path,
    title: str = "",
    quantity: str = "attention",
) -> None:
    """Left: the image with each region's box drawn with opacity and width by the attention (or transported mass)
    ``tokens[word]`` gives it; right: the text-to-region heat map (words x regions).

    Args:
        image: PIL image; boxes: float [R, 4] pixels xyxy; word_region: [T, R] from :func:`word_region_attention`
            or :func:`word_region_transport`; quantity: what the matrix holds ("attention", "transport"), for
            the titles.
    """
    plt = _pyplot()
    from matplotlib.patches import Rectangle

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=120, gridspec_kw={"width_ratios": [1, 1.4]})
    left.imshow(image)
    weights = word_region[word] / max(float(word_region[word].max()), 1e-12)
    for box, w in sorted(zip(boxes, weights, strict=True), key=lambda bw: bw[1]):
        x1, y1, x2, y2 = box
        left.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=True, alpha=0.35 * w, color="red"))
        left.add_patch(
            Rectangle(
                (x1, y1), x2 - x1, y2 - y1, fill=False, linewidth=0.5 + 2.5 * w, edgecolor=(1, 0, 0, 0.2 + 0.8 * w)
            )
        )
    left.set_title(f"regions shaded by {quantity} from {tokens[word]!r}", fontsize=9)
    left.axis("off")
    right.imshow(word_region, cmap="Reds", aspect="auto")
    right.set_yticks(range(len(tokens)))
    right.set_yticklabels(tokens, fontsize=7)
    right.set_xticks(range(len(region_labels)))
    right.set_xticklabels(region_labels, rotation=70, fontsize=6)
    right.set_title(f"text -> region {quantity} (rows renormalised)", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


__all__ = [
    "head_statistics",
    "plot_head_statistics",
    "plot_text_attention",
    "word_region_attention",
    "word_region_transport",
    "plot_word_regions",
]
