#!/usr/bin/env python
"""``vlbert benchmark text-corpus`` as a script: ``python tools/benchmark_text_corpus.py --help`` (the code: ``vlbert/commands/benchmark/text_corpus``)."""

import sys

from vlbert.command_line import run_tool
from vlbert.commands.benchmark.text_corpus import main as main

if __name__ == "__main__":
    sys.exit(run_tool(main))
