"""The one rule every ``vlbert`` command (and so every script in ``tools/``) follows for errors, as argparse does for its flags: an error in what the
user supplied (config files and values, flags, data files and their records, checkpoints, shards, images) is
printed as one line, ``error: <what is wrong and the fix>``, with exit status 2; a traceback means a bug in vlbert.

Library callers keep the exception types (``ValueError``, ``FileNotFoundError``, ``RegionError``, ...): only
:func:`run_tool` turns them into lines. Which exceptions are the user's:

* ``ValueError`` and its subclasses (``RegionError``, ``ShardError``, ``ImageDecodeError``), ``OSError`` and its
  subclasses (``FileNotFoundError``, ``RunExistsError``) and ``ModuleNotFoundError`` raised by vlbert's own code
  (``vlbert/``, ``vlbert_base/``, ``detectors/``, ``tools/``): vlbert raises these only after checking what it
  was given, with a message that names the input; the same types raised deep inside torch or numpy are not
  checked input, so they keep their traceback;
* an ``OSError`` about a named file (``FileNotFoundError``, ``IsADirectoryError``, ``PermissionError``, ... with a
  ``filename``), wherever it is raised: the message names the file.

A diverged run (:class:`~vlbert.training.trainer.NonFiniteLossError`) and processes that cannot agree or reach
each other (:class:`~vlbert.training.processes.ProcessGroupError`) are one line too, with exit status 1, and a
preempted one (SIGTERM) exits with 143 after its checkpoint. ``VLBERT_TRACEBACK=1`` shows every traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from vlbert.training.processes import ProcessGroupError
from vlbert.training.trainer import NonFiniteLossError, TrainingPreempted

#: The directories whose code raises checked-input errors on purpose.
_OWN_CODE = tuple(
    str(Path(__file__).resolve().parents[2] / name) + os.sep for name in ("vlbert", "vlbert_base", "detectors", "tools")
)
USAGE_ERROR = 2
FAILED_RUN = 1
PREEMPTED = 143


def _raised_by_vlbert(error: BaseException) -> bool:
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(_OWN_CODE)


def is_user_error(error: BaseException) -> bool:
    """Whether ``error`` reports a problem with what the user supplied (see the module docstring)."""
    if isinstance(error, OSError) and error.filename is not None:
        return True
    return isinstance(error, (ValueError, OSError, ModuleNotFoundError)) and _raised_by_vlbert(error)


def one_line(error: BaseException) -> str:
    """``error``'s message on one line (newlines joined with "; ", an ``OSError``'s errno text and file kept)."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        text = f"{error.filename}: {error.strerror}"
    else:
        text = str(error) or type(error).__name__
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())


def _report(kind: str, error: BaseException) -> None:
    """Close progress bars still open (so the message starts its own line), then print ``kind: message``."""
    try:
        from tqdm import tqdm

        for bar in list(getattr(tqdm, "_instances", ())):
            bar.close()
    except ImportError:  # pragma: no cover - tqdm is a dependency
        pass
    sys.stderr.flush()
    print(f"{kind}: {one_line(error)}", file=sys.stderr)


def run_tool(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> int:
    """Run a command's ``main(argv)`` under the error rule (:func:`vlbert.commands.main` runs every command so); returns the exit status (0, 1, 2 or 143).

    Prints ``error: ...`` on standard error for a user error (status 2) or a diverged run (status 1). Any other
    exception propagates with its traceback. ``SystemExit`` (argparse, ``--help``) passes through.
    """
    show_traceback = os.environ.get("VLBERT_TRACEBACK", "") not in ("", "0")
    try:
        return main(argv) or 0
    except TrainingPreempted as e:
        _report("warning", e)
        return PREEMPTED
    except (NonFiniteLossError, ProcessGroupError) as e:
        if show_traceback:
            raise
        _report("error", e)
        return FAILED_RUN
    except Exception as e:
        if show_traceback or not is_user_error(e):
            raise
        _report("error", e)
        return USAGE_ERROR


__all__ = ["run_tool", "is_user_error", "one_line", "USAGE_ERROR", "FAILED_RUN", "PREEMPTED"]
