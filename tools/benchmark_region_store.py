#!/usr/bin/env python
"""``vlbert benchmark region-store`` as a script: ``python tools/benchmark_region_store.py --help`` (the code: ``vlbert/commands/benchmark/region_store``)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
