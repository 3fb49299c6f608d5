"""The run-directory policy: what a run may do with its ``--output-dir``. A directory holding a run is continued
(``--resume``), replaced (``--overwrite``) or refused; a directory holding files no run wrote is refused whatever
the flags; a finished run is not resumed. Nothing a run did not write is ever replaced or deleted, and an
interrupted overwrite never leaves a mixture that looks finished.

Which files are the run's: those its record lists (``run_files.json``, :mod:`vlbert.training.run_manifest`), with
the content it wrote, kept by :func:`record_run_files` as the run writes. A run written before that record existed
(a run directory without ``run_files.json``) owns the files named as a run names its files (:data:`RUN_FILES`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Iterable

from vlbert.run_files import CHECKPOINTS_DIR, LEGACY_PROCESSOR_FILE, PROCESSOR_FILE
from vlbert.training.run_manifest import MANIFEST_FILE, entry_change, read_manifest, write_manifest
from vlbert.utils import process_position

#: Files and folders whose presence means a directory holds a run (its record of its files among them: a run stopped
#: before its first log line holds that record, its processor and data record).
RUN_MARKERS = ("log.jsonl", "metrics.json", CHECKPOINTS_DIR, "model.safetensors", MANIFEST_FILE)
#: Every name a run writes in its directory (its markers, configs, processor, tokenizer, data record, logs and the
#: tasks' predictions files): an ``--overwrite`` deletes these, and refuses a directory holding any other file.
RUN_FILES = RUN_MARKERS + (
    "config.yaml",
    "config.json",
    PROCESSOR_FILE,
    LEGACY_PROCESSOR_FILE,
    "trained_on.json",
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "generation_config.json",
    "tensorboard",
    "predictions.jsonl",
    "predictions.csv",
    "predictions.json",
    "null_odds.json",
    "best_non_null_predictions.json",
    "vqa_results.json",
    "gqa_predictions.json",
)
#: What a finished run leaves last: an overwrite deletes these before anything else.
FINISHED_MARKERS = ("metrics.json", "model.safetensors", PROCESSOR_FILE, LEGACY_PROCESSOR_FILE)


class RunExistsError(FileExistsError):
    """The output directory already holds a run and neither resume nor overwrite was asked for."""


def prepare_output_dir(output_dir: str | Path, resume: bool, overwrite: bool) -> None:
    """Apply the run-directory policy: a directory holding a run is continued (``resume``), replaced
    (``overwrite``: the run's files are deleted, those that mark a finished run first, so an interrupted overwrite
    never leaves a mixture that looks finished) or refused; a new or empty directory is left to the trainer; a
    directory holding other files (no run's: a user's ``predictions.json``) is refused whatever the flags, so that
    nothing a run did not write is replaced or deleted (hidden files such as ``.DS_Store`` aside, and left alone).

    The run's files are those its ``run_files.json`` lists with the content it wrote (a run written before that
    record: the names of :data:`RUN_FILES`). ``overwrite`` refuses a directory holding any other file, or one of the
    run's changed since; ``resume`` refuses such a file only under a name the resumed run writes (it would replace
    it).

    Raises:
        RunExistsError: the directory holds a run and neither flag is set (the message names both flags), or it
            holds files no run wrote, or a run's file changed since the run wrote it (the file named, and the fix:
            move it out of the directory, or choose another --output-dir).
        ValueError: both flags are set; the run's ``run_files.json`` is damaged.
    """
    if resume and overwrite:
        raise ValueError("--resume continues the run in --output-dir and --overwrite replaces it: pass one")
    directory = Path(output_dir)
    found = [name for name in RUN_MARKERS if (directory / name).exists()]
    if not found:
        others = sorted(p.name for p in directory.iterdir() if not p.name.startswith(".")) if directory.is_dir() else []
        if others:  # the run would write among files it did not write, and --overwrite would delete them
            raise RunExistsError(
                f"{directory} holds files that no run wrote ({_listed(others)}); a run writes only into a new or "
                "empty directory: choose another --output-dir"
            )
        return
    if not (resume or overwrite):
        raise RunExistsError(
            f"{directory} already holds a run ({', '.join(found)}); pass --resume to continue it, "
            "--overwrite to replace it, or choose another --output-dir"
        )
    owned = _refuse_files_not_the_runs(directory, overwrite)
    if resume:
        return
    from accelerate import PartialState

    if PartialState().is_main_process:
        for path in _deletion_order(directory, owned):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    PartialState().wait_for_everyone()


def _listed(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _refuse_files_not_the_runs(directory: Path, overwrite: bool) -> list[str]:
    """The names of ``directory``'s entries that are the run's; refuses (:class:`RunExistsError`) an entry that
    is not (for a resume, only under a name the run writes) or one the run wrote that changed since."""
    manifest = read_manifest(directory)
    names = sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))
    if manifest is None:  # a run written before run_files.json: the files named as a run names its files
        owned = [n for n in names if n in RUN_FILES]
        changed: list[tuple[str, str]] = []
    else:
        owned = [n for n in names if n in manifest or n == MANIFEST_FILE]
        changed = [(n, why) for n in owned if n in manifest and (why := entry_change(directory / n, manifest[n]))]
    foreign = [n for n in names if n not in owned and (overwrite or n in RUN_FILES)]
    flag = "--overwrite replaces a run" if overwrite else "--resume continues a run"
    if changed:
        name, why = changed[0]
        raise RunExistsError(
            f"{directory / name} {why} (it is not the file {MANIFEST_FILE} records); {flag}, never a file "
            "someone changed: move it out of the directory, or choose another --output-dir"
        )
    if foreign:
        raise RunExistsError(
            f"{directory} holds a run and files no run wrote ({_listed(foreign)}); {flag}, never other files: "
            "move them out of the directory, or choose another --output-dir"
        )
    return owned


def _deletion_order(directory: Path, owned: list[str]) -> list[Path]:
    """What an overwrite deletes, in order: the run's files that mark a finished run, its other files, the
    temporary files of its atomic writes (``.<name>.<pid>.tmp``), and last its record of its files."""
    first = [n for n in FINISHED_MARKERS if n in owned]
    temporary = [p.name for p in directory.iterdir() if p.name.startswith(".") and _is_run_temporary(p.name[1:])]
    rest = [n for n in owned if n not in first and n != MANIFEST_FILE]
    return [directory / n for n in [*first, *rest, *temporary, MANIFEST_FILE]]


def _is_run_temporary(name: str) -> bool:
    parts = name.rsplit(".", 2)
    return len(parts) == 3 and parts[0] in RUN_FILES and parts[1].isdigit() and parts[2] == "tmp"


def record_run_files(output_dir: str | Path, written: Iterable[str] = ()) -> None:
    """Record the run's files in ``output_dir`` as the run's, with their content now, in its ``run_files.json``
    (main process only; atomically): every entry named as a run names its files (:data:`RUN_FILES`), those the
    record lists already, and ``written`` (names the caller just wrote). Called by the run after each write; sound
    because a run starts only where every such entry is its own (:func:`prepare_output_dir`).

    Raises:
        OSError: an entry cannot be read, or the record cannot be written.
    """
    if process_position()[0] != 0:
        return
    try:
        listed = list(read_manifest(output_dir) or ())
    except ValueError:  # a damaged record (the run's own, being rewritten): its names are those of RUN_FILES
        listed = []
    names = {*RUN_FILES, *listed, *written} - {MANIFEST_FILE}
    write_manifest(output_dir, names)


def refuse_resuming_a_finished_run(output_dir: str | Path, max_steps: int) -> None:
    """``--resume`` continues an unfinished run: a run whose ``metrics.json`` (written when it finished) says it
    reached ``max_steps`` is refused, before anything is trained or rewritten (it retrained the steps after its last
    checkpoint and rewrote ``metrics.json`` and ``log.jsonl``).

    Raises:
        RunExistsError: the run finished at a step >= ``max_steps`` (the message says how to train further).
    """
    path = Path(output_dir) / "metrics.json"
    try:
        step = json.loads(path.read_text(encoding="utf-8")).get("step")
    except (OSError, ValueError, AttributeError):
        return  # no finished run's record: resume as usual (a damaged file is the trainer's to rewrite)
    if isinstance(step, int) and step >= max_steps:
        raise RunExistsError(
            f"--resume: the run in {output_dir} finished at step {step} (metrics.json) and training.max_steps is "
            f"{max_steps}: nothing is left to train; raise --max-steps to train it further, or pass --overwrite "
            "to start again"
        )


__all__ = [
    "RUN_MARKERS",
    "RUN_FILES",
    "FINISHED_MARKERS",
    "RunExistsError",
    "prepare_output_dir",
    "record_run_files",
    "refuse_resuming_a_finished_run",
]
