#!/usr/bin/env python
"""``vlbert explain`` as a script: ``python tools/explain.py --help`` (the code: ``vlbert/commands/explain``)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
