#!/usr/bin/env python
"""``vlbert train-tokenizer`` as a script: ``python tools/train_tokenizer.py --help`` (the code: ``vlbert/commands/train_tokenizer``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.train_tokenizer import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
