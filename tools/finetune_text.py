#!/usr/bin/env python
"""``vlbert finetune --task text`` as a script: ``python tools/finetune_text.py --help`` (the code:
``vlbert/commands/finetune``; ``--dataset bbc-news|glue|custom`` picks the text data)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
