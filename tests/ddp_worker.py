"""Run text pretraining in float64 (so float32 rounding of differently shaped batches does not mask the
distributed algorithm): used by test_distributed.py, alone or under torchrun. Argument: a JSON run config."""

import json
import sys

import torch

if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    from vlbert.training.text_pretraining import run_text_pretraining

    run_text_pretraining(json.loads(sys.argv[1]), resume="--resume" in sys.argv)
