"""Run text pretraining in float64 (so float32 rounding of differently shaped batches does not mask the
distributed algorithm): used by test_distributed.py, alone or under torchrun. Arguments: a JSON run config, then
optionally a recipe name (default text-pretraining) and --resume."""

import json
import sys

import torch

if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    from vlbert.recipes import RECIPES, run

    recipe = next((a for a in sys.argv[2:] if a in RECIPES), "text-pretraining")
    run(RECIPES[recipe], json.loads(sys.argv[1]), resume="--resume" in sys.argv)
