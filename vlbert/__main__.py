"""``python -m vlbert <command>``: the ``vlbert`` console command (:mod:`vlbert.commands`)."""

import sys

from vlbert.commands import main

sys.exit(main())
