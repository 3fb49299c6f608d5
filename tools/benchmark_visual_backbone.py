#!/usr/bin/env python
"""``vlbert benchmark visual-backbone`` as a script: ``python tools/benchmark_visual_backbone.py --help`` (the code:
``vlbert/commands/benchmark/visual_backbone``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.benchmark.visual_backbone import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
