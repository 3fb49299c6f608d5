#!/usr/bin/env python
"""``vlbert benchmark region-store`` as a script: ``python tools/benchmark_region_store.py --help`` (the code: ``vlbert/commands/benchmark/region_store``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.benchmark.region_store import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
