"""The run-directory policy: what a run may do with its ``--output-dir``. A directory holding a run is continued
(``--resume``), replaced (``--overwrite``) or refused; a directory holding files no run wrote is refused whatever
the flags; a finished run is not resumed. Nothing a run did not write is ever replaced or deleted, and an
interrupted overwrite never leaves a mixture that looks finished."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from vlbert.run_files import CHECKPOINTS_DIR, LEGACY_PROCESSOR_FILE, PROCESSOR_FILE

#: Files and folders whose presence means a directory holds a run.
RUN_MARKERS = ("log.jsonl", "metrics.json", CHECKPOINTS_DIR, "model.safetensors")
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
    (``overwrite``: everything in it is deleted, the files that mark a finished run first, so an interrupted
    overwrite never leaves a mixture that looks finished) or refused; a new or empty directory is left to the
    trainer; a directory holding other files (no run's: a user's ``predictions.json``) is refused whatever the flags,
    so that nothing a run did not write is replaced or deleted (hidden files such as ``.DS_Store`` aside).

    Raises:
        RunExistsError: the directory holds a run and neither flag is set (the message names both flags), or it
            holds files no run wrote (with ``overwrite`` too: names outside :data:`RUN_FILES` beside a run).
        ValueError: both flags are set.
    """
    if resume and overwrite:
        raise ValueError("--resume continues the run in --output-dir and --overwrite replaces it: pass one")
    directory = Path(output_dir)
    found = [name for name in RUN_MARKERS if (directory / name).exists()]
    if not found:
        others = sorted(p.name for p in directory.iterdir() if not p.name.startswith(".")) if directory.is_dir() else []
        if others:  # the run would write among files it did not write, and --overwrite would delete them
            shown = ", ".join(others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else "")
            raise RunExistsError(
                f"{directory} holds files that no run wrote ({shown}); a run writes only into a new or empty "
                "directory: choose another --output-dir"
            )
        return
    if resume:
        return
    if not overwrite:
        raise RunExistsError(
            f"{directory} already holds a run ({', '.join(found)}); pass --resume to continue it, "
            "--overwrite to replace it, or choose another --output-dir"
        )
    foreign = sorted(p.name for p in directory.iterdir() if not p.name.startswith(".") and p.name not in RUN_FILES)
    if foreign:  # --overwrite replaces a run, not a user's file
        raise RunExistsError(
            f"{directory} holds a run and files no run wrote ({', '.join(foreign[:4])}"
            f"{f' and {len(foreign) - 4} more' if len(foreign) > 4 else ''}); --overwrite replaces a run, never "
            "other files: move them out of the directory, or choose another --output-dir"
        )
    from accelerate import PartialState

    if PartialState().is_main_process:
        finished = [directory / name for name in FINISHED_MARKERS]
        for path in finished + sorted(p for p in directory.iterdir() if p not in finished):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    PartialState().wait_for_everyone()


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
    "refuse_resuming_a_finished_run",
]
