#!/usr/bin/env python
"""``vlbert prepare-corpus`` as a script: ``python tools/prepare_corpus.py --help`` (the code: ``vlbert/commands/prepare_corpus``)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
