#!/usr/bin/env python
"""``python -m benchmarks text-then-vision`` as a script: ``python tools/benchmark_text_then_vision.py --help``
(the code: ``benchmarks/text_then_vision.py``).
The repository's benchmarks are not part of the vlbert package: the checkout's root goes on sys.path first."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import run_script  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_script(__file__))
