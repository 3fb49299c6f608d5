#!/usr/bin/env python
"""``vlbert extract`` as a script: ``python tools/extract_regions.py --help`` (the code: ``vlbert/commands/extract_regions``)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
