#!/usr/bin/env python
"""``vlbert finetune`` as a script: ``python tools/finetune.py --help`` (the code: ``vlbert/commands/finetune``)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
