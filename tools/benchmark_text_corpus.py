#!/usr/bin/env python
"""``vlbert benchmark text-corpus`` as a script: ``python tools/benchmark_text_corpus.py --help`` (the code: ``vlbert/commands/benchmark/text_corpus``)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
