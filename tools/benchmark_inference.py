#!/usr/bin/env python
"""``vlbert benchmark inference`` as a script: ``python tools/benchmark_inference.py --help`` (the code: ``vlbert/commands/benchmark/inference``)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
