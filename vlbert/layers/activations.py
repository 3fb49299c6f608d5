"""Feed-forward activations by their Hugging Face config names."""

from __future__ import annotations

import torch.nn.functional as F


def activation(name: str):
    """The feed-forward activation named by ``config.hidden_act`` (transformers' ACT2FN subset).

    ``gelu`` is the exact erf form used by BERT; ``gelu_new``/``gelu_pytorch_tanh`` the tanh approximation.
    """
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    raise ValueError(f"unsupported hidden_act {name!r}")


__all__ = ["activation"]
