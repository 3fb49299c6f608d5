#!/usr/bin/env python
"""``vlbert pretrain`` as a script: ``python tools/pretrain.py --help`` (the code: ``vlbert/commands/pretrain``)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
