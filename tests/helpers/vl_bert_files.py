"""VL-BERT's checkpoint files as its trainer writes them (the DDP state dict and the optimizer state)."""

from __future__ import annotations

import torch

OPTIMIZER = {"state": {0: {"step": 3, "exp_avg": torch.zeros(2)}}, "param_groups": [{"lr": 1e-4, "params": [0]}]}


def write_model_file(path, state, optimizer=True):
    """A ``.model`` file as VL-BERT's trainer saves it: the DDP state dict and the optimizer state."""
    torch.save({"state_dict": state, **({"optimizer": OPTIMIZER} if optimizer else {})}, path)
    return path
