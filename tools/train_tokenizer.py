#!/usr/bin/env python
"""``vlbert train-tokenizer`` as a script: ``python tools/train_tokenizer.py --help`` (the code: ``vlbert/commands/train_tokenizer``)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
