#!/usr/bin/env python
"""``vlbert predict`` as a script: ``python tools/predict.py --help`` (the code: ``vlbert/commands/predict``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.predict import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
