"""The processor's record on disk: a run or model directory (local, or a hub snapshot) and its saved record,
``processor.json`` (or, for one written before the processor existed, its ``inference.json``: read in
:mod:`vlbert.run_files`, the one place that knows the older file)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vlbert.hub import hub_snapshot, is_hub_name
from vlbert.run_files import PROCESSOR_FILE, processor_record_file, read_processor_record


def local_run_dir(run_dir: str | os.PathLike) -> Path:
    """The directory a run (or model) is read from: ``run_dir`` itself, or for a hub repository id (``org/name``)
    its snapshot in the hub cache (:func:`vlbert.hub.hub_snapshot`; ``HF_HUB_OFFLINE=1``: the cache only).

    Raises:
        FileNotFoundError: a hub id that is neither cached nor reachable.
    """
    return hub_snapshot(str(run_dir)) if is_hub_name(run_dir) else Path(run_dir).expanduser()


def load_processor_record(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The processor record of ``run_dir`` (a directory or hub id, :func:`local_run_dir`) as a dict.

    Raises:
        FileNotFoundError: neither processor.json nor (a run written before it) inference.json exists: not the
            output directory of a finished run.
        ValueError: the file is damaged, or names no ``task``.
    """
    directory = local_run_dir(run_dir)
    record = read_processor_record(directory)
    if record is None:
        raise FileNotFoundError(
            f"{directory / PROCESSOR_FILE} does not exist, and its older form inference.json does not exist either: "
            f"{run_dir} is not the output directory of a finished run or conversion (vlbert finetune, vlbert "
            "pretrain and vlbert convert write it)"
        )
    if "task" not in record:
        raise ValueError(f"{processor_record_file(directory)} names no task; train the run again to rewrite it")
    return record


def record_pipeline(record: dict[str, Any]) -> str:
    """The pipeline (a :data:`~vlbert.inference.pipelines.PIPELINES` key) a processor record names: its
    ``pipeline`` (the task's, :attr:`vlbert.recipes.Task.pipeline`; a record on disk that gave an earlier name,
    or its task only, is read with today's name: :func:`vlbert.run_files.read_processor_record`), else its
    ``task`` (a processor made for a model in memory: :meth:`~vlbert.processing.VLProcessor.for_model` is told the
    pipeline's name).

    Raises:
        KeyError: a record with neither (:func:`load_processor_record` refuses one without a task).
    """
    return record.get("pipeline") or record["task"]
