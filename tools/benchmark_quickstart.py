#!/usr/bin/env python
"""``vlbert benchmark quickstart`` as a script: ``python tools/benchmark_quickstart.py --help`` (the code: ``vlbert/commands/benchmark/quickstart``)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
