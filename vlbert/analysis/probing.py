"""Layer probes on frozen features (Tenney et al. 2019, "BERT rediscovers the classical NLP pipeline", section 3):
a linear classifier over a learned scalar mix of all layers, whose softmax weights say which layers the task draws
on (their "expected layer" = sum_l l * s_l, the centre of gravity), beside one linear probe per layer alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vlbert.models.heads import ScalarMix


@dataclass
class ProbeResult:
    """Attributes:
    mix_weights: float [L + 1], the scalar mix's softmax weights (layer 0 = embeddings).
    expected_layer: sum_l l * mix_weights[l].
    mix_accuracy: held-out accuracy of the probe over the mix.
    layer_accuracy: float [L + 1], held-out accuracy of a probe on each layer alone.
    majority_accuracy: held-out accuracy of always answering the most frequent training label.
    """

    mix_weights: list[float]
    expected_layer: float
    mix_accuracy: float
    layer_accuracy: list[float]
    majority_accuracy: float


def _train(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, mix: ScalarMix | None, steps: int, seed: int
) -> torch.nn.Module:
    torch.manual_seed(seed)
    classifier = torch.nn.Linear(features.shape[-1], num_classes)
    params = list(classifier.parameters()) + (list(mix.parameters()) if mix is not None else [])
    optimizer = torch.optim.Adam(params, lr=1e-2)
    for _ in range(steps):
        x = mix(features.unbind(1)) if mix is not None else features
        loss = F.cross_entropy(classifier(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return classifier


def probe_layers(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    eval_features: torch.Tensor,
    eval_labels: torch.Tensor,
    steps: int = 300,
    seed: int = 0,
) -> ProbeResult:
    """Train the scalar-mix probe and the per-layer probes (full-batch Adam, lr 1e-2, ``steps`` steps).

    Args:
        train_features, eval_features: float [N, L + 1, H], one pooled vector per example and layer (frozen).
        train_labels, eval_labels: int64 [N] in [0, C).
    Raises:
        ValueError: features that are not [N, L + 1, H] or labels of another length.
    """
    if train_features.dim() != 3 or len(train_labels) != len(train_features) or len(eval_labels) != len(eval_features):
        raise ValueError("features must be [N, layers, H] with one label per row")
    num_classes = int(max(train_labels.max(), eval_labels.max())) + 1
    # Standardise each layer with training statistics: layers differ in scale, the mix should weigh content.
    mean, std = train_features.mean(0, keepdim=True), train_features.std(0, keepdim=True) + 1e-6
    train_x, eval_x = (train_features - mean) / std, (eval_features - mean) / std
    mix = ScalarMix(train_x.shape[1])
    classifier = _train(train_x, train_labels, num_classes, mix, steps, seed)
    with torch.no_grad():
        weights = mix.weights.softmax(0)
        mix_accuracy = (classifier(mix(eval_x.unbind(1))).argmax(-1) == eval_labels).float().mean().item()
    layer_accuracy = []
    for layer in range(train_x.shape[1]):
        single = _train(train_x[:, layer], train_labels, num_classes, None, steps, seed)
        with torch.no_grad():
            layer_accuracy.append((single(eval_x[:, layer]).argmax(-1) == eval_labels).float().mean().item())
    majority = torch.bincount(train_labels).argmax()
    return ProbeResult(
        weights.tolist(),
        float((weights * torch.arange(len(weights))).sum()),
        mix_accuracy,
        layer_accuracy,
        float((eval_labels == majority).float().mean()),
    )


def plot_probe(result: ProbeResult, title: str, path) -> None:
    """A PNG: the mix weights (bars) and each layer's own probe accuracy (line), with the expected layer and the
    majority baseline marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = range(len(result.mix_weights))
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.bar(layers, result.mix_weights, color="#9ecae1", label="scalar-mix weight")
    ax.axvline(
        result.expected_layer, color="#3182bd", linestyle="--", label=f"expected layer {result.expected_layer:.2f}"
    )
    ax.set_xlabel("layer (0 = embeddings)")
    ax.set_ylabel("mix weight")
    ax.set_xticks(list(layers))
    right = ax.twinx()
    right.plot(layers, result.layer_accuracy, color="#e6550d", marker="o", label="probe on the layer alone")
    right.axhline(result.majority_accuracy, color="grey", linestyle=":", label="majority class")
    right.set_ylabel("held-out accuracy")
    right.set_ylim(0, 1.02)
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="lower right")
    ax.set_title(f"{title} (mix probe: {result.mix_accuracy:.1%})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


__all__ = ["ProbeResult", "probe_layers", "plot_probe"]
