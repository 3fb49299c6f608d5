#!/usr/bin/env python
"""``vlbert finetune --task text`` (was ``vlbert finetune-text``) as a script: ``python tools/finetune_text.py --help`` (the code:
``vlbert/commands/finetune``; ``--task bbc-news|glue|custom`` still means ``--dataset``)."""

import sys

from vlbert.commands.scripts import run_script

if __name__ == "__main__":
    sys.exit(run_script(__file__))
