#!/usr/bin/env python
"""``vlbert explain`` as a script: ``python tools/explain.py --help`` (the code: ``vlbert/commands/explain``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.explain import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
