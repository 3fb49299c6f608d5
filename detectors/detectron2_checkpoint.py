"""Reading a detectron2 checkpoint file without detectron2 and without running code from it: the detectron2
backend and the plain-PyTorch BUTD detector (:mod:`vlbert.detectors.butd_vg`) both load their weights through
:func:`read_checkpoint`. ``.pkl`` files are read by :func:`vlbert.detectors.safe_pickle.load_plain_pickle` (numpy
arrays and plain containers only), ``.pth`` by ``torch.load(weights_only=True)``, ``.safetensors`` by safetensors.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from vlbert.detectors.safe_pickle import load_plain_pickle

#: Checkpoint keys of py-bottom-up-attention, which keeps the attribute layers inside the box predictor.
ATTRIBUTE_KEY_RENAMES = {
    f"roi_heads.box_predictor.{name}.": f"roi_heads.attribute_predictor.{name}."
    for name in ("cls_embedding", "attr_linear1", "attr_linear2")
}


def read_checkpoint(weights: str | os.PathLike) -> tuple[dict[str, torch.Tensor], bool]:
    """The state dict of a detectron2 checkpoint file, read without running code from it.

    ``.pkl``: detectron2 model-zoo format ({"model": {name: ndarray}, "__author__": ...}) or Caffe2/Detectron
    ({"blobs": ...} or a flat dict; names converted with detectron2's ``align_and_update_state_dicts`` at load);
    ``.pth``/``.pt``: ``torch.load(weights_only=True)`` of a state dict or {"model": state dict};
    ``.safetensors``: a state dict. py-bottom-up-attention's attribute keys are renamed
    (:data:`ATTRIBUTE_KEY_RENAMES`).

    Returns:
        (name -> tensor, whether the names are Caffe2/Detectron's and still need matching).
    Raises:
        FileNotFoundError: no such file. ValueError: another extension, a pickle that asks for code (see
            :func:`vlbert.detectors.safe_pickle.load_plain_pickle`), or a file that holds no state dict.
    """
    path = Path(weights).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"detector weights file {path} does not exist (detector.weights / --weights)")
    caffe2 = False
    if path.suffix == ".pkl":
        data = load_plain_pickle(path, numpy_arrays=True)
        if not isinstance(data, dict):
            raise ValueError(f"{path} holds a {type(data).__name__}, not a checkpoint dict")
        if "model" in data and "__author__" in data:
            state = data["model"]
            caffe2 = bool(data.get("matching_heuristics")) or data["__author__"] == "Caffe2"
        else:
            state = data.get("blobs", data)
            state = {k: v for k, v in state.items() if not k.endswith("_momentum")}
            caffe2 = True
    elif path.suffix in (".pth", ".pt"):
        data = torch.load(path, map_location="cpu", weights_only=True)
        state = data.get("model", data) if isinstance(data, dict) else None
    elif path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        raise ValueError(f"weights file {path}: unknown extension {path.suffix!r}; use .pkl, .pth or .safetensors")
    if not isinstance(state, dict) or not state:
        raise ValueError(f"{path} holds no state dict (name -> array)")
    out = {}
    for name, value in state.items():
        if not isinstance(value, (np.ndarray, torch.Tensor)):
            continue  # e.g. a stray step counter
        for old, new in ATTRIBUTE_KEY_RENAMES.items():
            if name.startswith(old):
                name = new + name[len(old) :]
        out[name] = torch.as_tensor(np.ascontiguousarray(value) if isinstance(value, np.ndarray) else value)
    return out, caffe2


__all__ = ["ATTRIBUTE_KEY_RENAMES", "read_checkpoint"]
