"""The masked-region objectives' targets padded into the batch: each image's detector class (or attribute)
distribution, as :func:`vlbert.processing.regions.region_item` slices it, under the model's region padding."""

from __future__ import annotations

import numpy as np
import torch


def pad_class_probs(items: list[dict], num_regions: int, key: str = "class_probs") -> torch.Tensor:
    """float16 [B, num_regions, C]: each item's ``key`` distribution (``class_probs``, or ``attribute_probs`` for
    attribute classification) padded with zero rows.

    Raises:
        ValueError: an item has no such distribution (the detector did not write one).
    """
    if any(x.get(key) is None for x in items):
        raise ValueError(
            f"masked region classification needs the detector's {key} in the shards; extract with a "
            f"backend that writes them (butd-vg writes classes and attributes) or drop the objective"
        )
    probs = torch.zeros(len(items), num_regions, items[0][key].shape[1], dtype=torch.float16)
    for i, x in enumerate(items):
        probs[i, : len(x[key])] = torch.from_numpy(np.asarray(x[key]))
    return probs


def masked_class_probs(items: list[dict], masked: torch.Tensor, key: str = "class_probs") -> torch.Tensor:
    """float16 [M, C]: the ``key`` distributions of the masked regions only (bool ``masked`` [B, R], True among
    each item's real regions), in row-major order (row by row, region by region: the order of
    ``masked_region_positions``), as :func:`pad_class_probs` ``[masked]`` gives them without padding every region.
    Raises ValueError as :func:`pad_class_probs`."""
    if any(x.get(key) is None for x in items):
        pad_class_probs(items, masked.shape[1], key)  # raises, naming the fix
    rows = [torch.from_numpy(np.asarray(x[key]))[m[: len(x[key])]] for x, m in zip(items, masked, strict=True)]
    return torch.cat(rows).to(torch.float16)


__all__ = ["pad_class_probs", "masked_class_probs"]
