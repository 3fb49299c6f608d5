#!/usr/bin/env python
"""``vlbert pretrain`` as a script: ``python tools/pretrain.py --help`` (the code: ``vlbert/commands/pretrain``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.pretrain import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
