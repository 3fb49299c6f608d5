"""``vlbert benchmark <what> [flags]`` in a clone of the repository: ``python -m benchmarks <what> [flags]`` in a
child process.

The benchmarks (train step against transformers, inference, extraction, region store, text corpus, visual
backbone, the quick-start re-runner, the memory plan, retrieval evaluation, ITC + ITM against ITM alone) live in the repository's top-level ``benchmarks/`` folder, beside the library
and outside the ``vlbert`` wheel. This command imports none of them: where the package is used from a checkout (an
editable install, or the clone's root on ``PYTHONPATH``), it finds ``benchmarks/`` beside the package's source and
runs it with this Python, the checkout's root first on the child's ``PYTHONPATH`` (so the child imports this
checkout's ``benchmarks`` and ``vlbert``), and returns the child's exit status. An installed wheel has no
benchmarks: it says so in one line (status 2), with how to run them from a clone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

#: The repository root of the checkout this package's source sits in (its ``benchmarks/`` beside ``vlbert/``).
CHECKOUT = Path(__file__).resolve().parents[2]


def benchmarks_folder(root: Path = CHECKOUT) -> Path | None:
    """The checkout's ``benchmarks/`` folder beside the package's source, or None where there is none (an installed
    wheel: the folder beside ``site-packages/vlbert`` is not a checkout's, even where another distribution put a
    ``benchmarks`` package there)."""
    folder = root / "benchmarks"
    if (folder / "__main__.py").is_file() and (root / "pyproject.toml").is_file() and (root / "vlbert").is_dir():
        return folder
    return None


def main(argv: Sequence[str] | None = None, root: Path = CHECKOUT) -> int:
    """Run ``python -m benchmarks <argv>`` from the checkout at ``root``; returns its exit status (128 + the signal
    for a child ended by one). A SIGTERM sent to this process is passed on to the child; Ctrl-C reaches the child
    from the terminal.

    Raises:
        ModuleNotFoundError: no ``benchmarks/`` beside the package (an installed wheel): the one line says where
            the benchmarks are and how to run them.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if benchmarks_folder(root) is None:
        raise ModuleNotFoundError(
            "the benchmarks are not part of the installed vlbert package: they live in the repository's benchmarks/ "
            "folder; in a clone of it, run python -m benchmarks <name> [flags] from its root "
            "(python -m benchmarks --help lists them)"
        )
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *([path] if path else [])])}
    child = subprocess.Popen([sys.executable, "-m", "benchmarks", *argv], env=env)
    # As system(3) does: Ctrl-C reaches the child from the terminal (one process group), so this process ignores it
    # while it waits; a SIGTERM sent to this process alone (a job's time limit) is passed on. (Set after the start:
    # an ignored signal would stay ignored in the child.)
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
        handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, lambda number, frame: child.send_signal(number))
    try:
        status = child.wait()
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    return 128 - status if status < 0 else status


__all__ = ["CHECKOUT", "benchmarks_folder", "main"]
