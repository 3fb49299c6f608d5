#!/usr/bin/env python
"""``vlbert prepare-corpus`` as a script: ``python tools/prepare_corpus.py --help`` (the code: ``vlbert/commands/prepare_corpus``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.prepare_corpus import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
