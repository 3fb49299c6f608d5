"""``python -m benchmarks <what> [flags]`` from a clone's root: the benchmark ``<what>`` (:data:`benchmarks.BENCHMARKS`)
under vlbert's error rule (one ``error: ...`` line, status 2, for a user error)."""

import sys

from benchmarks import main
from vlbert.commands import run_tool

sys.argv[0] = "python -m benchmarks"  # argparse names the program after sys.argv[0] in usage lines
sys.exit(run_tool(main))
