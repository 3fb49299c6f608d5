#!/usr/bin/env python
"""``vlbert benchmark extraction`` as a script: ``python tools/benchmark_extraction.py --help`` (the code: ``vlbert/commands/benchmark/extraction``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.benchmark.extraction import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
