"""The run-directory format below both the recipes (which write it) and inference (which reads it): the name of
the processor's file (``processor.json``, beside ``config.json``) and of its older form (``inference.json``, what
runs and conversions wrote before the processor existed), the one reader that falls back to the older file and
reads earlier records' pipeline names as today's, its writer, and the reader of a run or model directory's JSON
files that refuses a damaged file in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from vlbert.common.files import write_text_atomically
from vlbert.common.typed_config import ConfigValueError, Range, Takes, check_value
from vlbert.common.user_files import UserFileError, expect, read_json

#: The folder of a run directory that holds its checkpoints (``checkpoints/step-N``).
CHECKPOINTS_DIR = "checkpoints"

#: The processor's record (:class:`vlbert.processing.VLProcessor`): task, labels, lengths, the region source.
PROCESSOR_FILE = "processor.json"
#: The same record as runs and conversions wrote it before ``processor.json``: read when no processor.json exists.
LEGACY_PROCESSOR_FILE = "inference.json"
#: The version of the record's fields (1: inference.json; 2: processor.json, the same fields plus processor_class).
PROCESSOR_FORMAT_VERSION = 2
#: Pipeline names as records on disk give them -> today's names (:data:`vlbert.inference.PIPELINES`). Each was its
#: task's name: runs written before the pipelines were named by what they do record ``"pipeline": "vqa"``; runs
#: written before recipes named their pipeline, and conversions (``vlbert convert``), record only ``"task": "vqa"``.
#: :func:`read_processor_record` reads them under today's names.
PIPELINES_BY_EARLIER_NAME = {
    "vqa": "visual-question-answering",
    "retrieval": "image-text-retrieval",
    "nlvr2": "visual-reasoning",
    "snli-ve": "visual-entailment",
    "refcoco": "referring-expression-comprehension",
    "vl-pretraining": "fill-mask",
    "text": "text-classification",
    "text-pretraining": "text-fill-mask",
}


_Count = Annotated[int, Range(ge=1)]
#: The processor record's fields of a known type -> their annotation (read by :func:`check_value`).
PROCESSOR_FIELD_TYPES: dict[str, Any] = {
    "task": str,
    "pipeline": str,
    "labels": Annotated[list, Takes('a list of the label names in logit order, e.g. ["yes", "no"]')],
    "max_text_length": _Count | None,
    "max_regions": _Count | None,
    "region_feature_dim": _Count | None,
    "detector": dict | None,
    "image_preprocessing": dict | None,
    "shortlist": _Count,
    "format_version": int,
}


def check_processor_fields(record: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """``record`` (a processor record read from ``path``) with its fields of :data:`PROCESSOR_FIELD_TYPES` checked.

    Raises:
        UserFileError: a field of another type, named with the file and what it takes (labels edited into an
            id -> label mapping: the fix says to write the list in logit order).
    """
    for name, tp in PROCESSOR_FIELD_TYPES.items():
        if name not in record:
            continue
        value = record[name]
        fix = f"correct it, or write {Path(path).parent} again (re-run the conversion or the run that made it)"
        if name == "labels" and isinstance(value, dict):
            fix = "write the labels as a list in logit order (the mapping's values, ordered by id)"
        try:
            check_value(value, tp, name)
        except ConfigValueError as e:
            raise UserFileError(f"{path}: field {e.key!r} must be {e.takes}, got {repr(e.value)[:60]}; {fix}") from None
    return record


def write_processor_record(output_dir: str | Path, record: dict[str, Any]) -> Path:
    """Write ``output_dir/processor.json`` (``record`` plus ``processor_class`` and ``format_version``)
    atomically: a reader never sees half a file. Returns its path."""
    header = {"processor_class": "VLProcessor", "format_version": PROCESSOR_FORMAT_VERSION}
    text = json.dumps({**header, **{k: v for k, v in record.items() if k not in header}}, indent=1)
    return write_text_atomically(Path(output_dir) / PROCESSOR_FILE, text)


def processor_record_file(directory: str | Path) -> Path | None:
    """The file holding ``directory``'s processor record: ``processor.json``, else (a run or conversion written
    before it) ``inference.json``, else None (a directory without one: the packaged MiniLM, a converted text BERT).
    The one place that knows the older file."""
    for name in (PROCESSOR_FILE, LEGACY_PROCESSOR_FILE):
        path = Path(directory) / name
        if path.is_file():
            return path
    return None


def read_processor_record(directory: str | Path) -> dict[str, Any] | None:
    """``directory``'s processor record as a dict (:func:`processor_record_file`; None where it has none), its
    pipeline under today's name: a ``pipeline`` (else, where it names none, a ``task``) of
    :data:`PIPELINES_BY_EARLIER_NAME` is read as the pipeline it names now.

    Raises:
        UserFileError (a ``ValueError``): a damaged file (see :func:`read_run_file`), a field of another type
            (:func:`check_processor_fields`).
    """
    path = processor_record_file(directory)
    if path is None:
        return None
    record = check_processor_fields(read_run_file(path), path)
    earlier = record.get("pipeline") or record.get("task")
    if earlier in PIPELINES_BY_EARLIER_NAME:
        record["pipeline"] = PIPELINES_BY_EARLIER_NAME[earlier]
    return record


def read_run_file(path: str | Path) -> dict[str, Any]:
    """A run or model directory's JSON mapping (``config.json``, ``processor.json``) as a dict.

    Raises:
        FileNotFoundError: no such file. UserFileError (a ``ValueError``): cut off or not JSON, or not a mapping
            (the file, line and column named, and the fix: write the directory again, e.g. by re-running the
            conversion or the run).
    """
    path = Path(path)
    fix = f"{path.parent} is damaged: write it again (re-run the conversion or the run that made it)"
    return expect(read_json(path, path.name, fix), dict, str(path), "the file's content", fix)


__all__ = [
    "CHECKPOINTS_DIR",
    "PROCESSOR_FILE",
    "LEGACY_PROCESSOR_FILE",
    "PROCESSOR_FORMAT_VERSION",
    "PIPELINES_BY_EARLIER_NAME",
    "PROCESSOR_FIELD_TYPES",
    "check_processor_fields",
    "write_processor_record",
    "processor_record_file",
    "read_processor_record",
    "read_run_file",
]
