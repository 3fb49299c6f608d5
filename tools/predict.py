#!/usr/bin/env python
"""``vlbert predict`` as a script: ``python tools/predict.py --help`` (the code: ``vlbert/commands/predict``)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
