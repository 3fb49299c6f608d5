#!/usr/bin/env python
"""``vlbert benchmark [train]`` as a script: ``python tools/benchmark.py --help`` (the code: ``vlbert/commands/benchmark``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.benchmark import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
