"""A small detectron2 model and random weights for it, shared by the detectron2 and the README-path tests."""

from __future__ import annotations

import pickle

import torch
from vlbert.detectors.detectron2_detector import load_config  # noqa: E402

SMALL = {
    "INPUT.MIN_SIZE_TEST": 96,
    "INPUT.MAX_SIZE_TEST": 160,
    "MODEL.RPN.PRE_NMS_TOPK_TEST": 200,
    "MODEL.RPN.POST_NMS_TOPK_TEST": 24,
}


def random_weights(config_file, overrides, path, layout="d2-pkl", seed=0, edit=None):
    """Save a randomly initialised model of the config: detectron2 model-zoo .pkl, .pth, .safetensors, or
    py-bottom-up-attention's .pkl (attribute layers inside the box predictor)."""
    from detectron2.modeling import build_model

    torch.manual_seed(seed)
    model = build_model(load_config(config_file, overrides))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # Random box deltas stretch every anchor to the whole image; zero ones keep the anchors as proposals (many
    # distinct boxes, as a trained RPN gives).
    for k in state:
        if "anchor_deltas" in k:
            state[k].zero_()
    if edit is not None:
        edit(state)
    if layout in ("d2-pkl", "butd-pkl"):
        arrays = {k: v.numpy() for k, v in state.items()}
        if layout == "butd-pkl":
            arrays = {
                k.replace("roi_heads.attribute_predictor.", "roi_heads.box_predictor."): v for k, v in arrays.items()
            }
        path.write_bytes(pickle.dumps({"model": arrays, "__author__": "test"}))
    elif layout == "pth":
        torch.save(state, path)
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path
