#!/usr/bin/env python
"""``vlbert convert`` as a script: ``python tools/convert_checkpoint.py --help`` (the code: ``vlbert/commands/convert_checkpoint``)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
