#!/usr/bin/env python
"""``vlbert finetune`` as a script: ``python tools/finetune.py --help`` (the code: ``vlbert/commands/finetune``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.finetune import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
