#!/usr/bin/env python
"""``vlbert benchmark quickstart`` as a script: ``python tools/benchmark_quickstart.py --help`` (the code: ``vlbert/commands/benchmark/quickstart``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.benchmark.quickstart import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
