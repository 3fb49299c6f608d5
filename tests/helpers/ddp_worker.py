"""Run text pretraining in float64 (so float32 rounding of differently shaped batches does not mask the
distributed algorithm): used by test_distributed.py, alone or under torchrun. Arguments: a JSON run config (or a
JSON list of [recipe, run config] pairs, run in turn in one launch), then optionally a recipe name (default
text-pretraining) and --resume."""

import json
import sys

import torch

if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    from vlbert.recipes import RECIPES, run

    recipe = next((a for a in sys.argv[2:] if a in RECIPES), "text-pretraining")
    runs = json.loads(sys.argv[1])  # one run config, or a list of [recipe, config]: one launch, several runs
    for name, config in [(recipe, runs)] if isinstance(runs, dict) else runs:
        run(RECIPES[name], config, resume="--resume" in sys.argv)
