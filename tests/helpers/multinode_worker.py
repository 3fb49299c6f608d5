"""One node's process of the two-node tests (tests/training/test_multinode.py): text pretraining in float64 (as
helpers.distributed.launch's workers) run under the tools' error rule (``run_tool``: one ``error:`` line, exit 1 / 2,
143 after SIGTERM), each optimizer step held ``VLBERT_TEST_STEP_SECONDS`` seconds longer (a slow step, to be preempted during one).
Arguments: a JSON run config, then optionally --resume."""

import json
import os
import sys
import time

import torch

if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    from vlbert.commands import run_tool
    from vlbert.recipes import RECIPES, run
    from vlbert.training.hooks import TrainerHook

    class SlowSteps(TrainerHook):
        """Sleep before each step (a signal handler runs during the sleep, which then goes on: PEP 475)."""

        def __init__(self, seconds: float):
            self.seconds = seconds

        def before_step(self, trainer) -> None:
            time.sleep(self.seconds)

    def main(argv):
        hooks = [SlowSteps(float(os.environ.get("VLBERT_TEST_STEP_SECONDS", "0")))]
        run(RECIPES["text-pretraining"], json.loads(argv[0]), resume="--resume" in argv, hooks=hooks)

    sys.exit(run_tool(main, sys.argv[1:]))
