#!/usr/bin/env python
"""``vlbert finetune-text`` as a script: ``python tools/finetune_text.py --help`` (the code: ``vlbert/commands/finetune_text``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.finetune_text import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
