#!/usr/bin/env python
"""``vlbert benchmark [train]`` as a script: ``python tools/benchmark.py --help`` (the code: ``vlbert/commands/benchmark``)."""

import sys

from vlbert.commands.benchmark.train import bbc_news_pairs  # noqa: F401  (../shared/gpu/roofline.py reads it here)
from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
