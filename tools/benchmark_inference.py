#!/usr/bin/env python
"""``vlbert benchmark inference`` as a script: ``python tools/benchmark_inference.py --help`` (the code: ``vlbert/commands/benchmark/inference``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.benchmark.inference import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
