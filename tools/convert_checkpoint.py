#!/usr/bin/env python
"""``vlbert convert`` as a script: ``python tools/convert_checkpoint.py --help`` (the code: ``vlbert/commands/convert_checkpoint``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.convert_checkpoint import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
