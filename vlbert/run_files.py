"""The run-directory format below both the recipes (which write it) and inference (which reads it): the name of
``inference.json``, its writer, and the reader of a run or model directory's JSON files (``config.json``,
``inference.json``) that refuses a damaged file in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vlbert_base.files import write_text_atomically
from vlbert_base.user_files import expect, read_json

#: What inference needs to rebuild a run's inputs: task, labels, lengths, the regions' detector provenance.
INFERENCE_INFO = "inference.json"


def write_inference_info(output_dir: str | Path, info: dict[str, Any]) -> Path:
    """Write ``output_dir/inference.json`` (``info`` plus ``format_version``) atomically: a reader never sees half
    a file. Returns its path."""
    return write_text_atomically(Path(output_dir) / INFERENCE_INFO, json.dumps({"format_version": 1, **info}, indent=1))


def read_run_file(path: str | Path) -> dict[str, Any]:
    """A run or model directory's JSON mapping (``config.json``, ``inference.json``) as a dict.

    Raises:
        FileNotFoundError: no such file. UserFileError (a ``ValueError``): cut off or not JSON, or not a mapping
            (the file, line and column named, and the fix: write the directory again, e.g. by re-running the
            conversion or the run).
    """
    path = Path(path)
    fix = f"{path.parent} is damaged: write it again (re-run the conversion or the run that made it)"
    return expect(read_json(path, path.name, fix), dict, str(path), "the file's content", fix)


__all__ = ["INFERENCE_INFO", "write_inference_info", "read_run_file"]
