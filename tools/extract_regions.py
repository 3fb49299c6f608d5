#!/usr/bin/env python
"""``vlbert extract`` as a script: ``python tools/extract_regions.py --help`` (the code: ``vlbert/commands/extract_regions``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.extract_regions import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
