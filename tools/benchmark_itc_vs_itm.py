#!/usr/bin/env python
"""``python -m benchmarks itc-vs-itm`` as a script: ``python tools/benchmark_itc_vs_itm.py --help``
(the code: ``benchmarks/itc_vs_itm.py``).
The repository's benchmarks are not part of the vlbert package: the checkout's root goes on sys.path first."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import run_script  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_script(__file__))
