#!/usr/bin/env python
"""``vlbert benchmark visual-backbone`` as a script: ``python tools/benchmark_visual_backbone.py --help`` (the code:
``vlbert/commands/benchmark/visual_backbone``)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
