#!/usr/bin/env python
"""``vlbert benchmark extraction`` as a script: ``python tools/benchmark_extraction.py --help`` (the code: ``vlbert/commands/benchmark/extraction``)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
