"""Reading a run config before anything is built: every value through its type (the top-level keys, ``training``,
``data``, ``detector``, ``model``; :mod:`vlbert.common.typed_config`), and, for ``--resume``, the comparison with the
config the run started with (its ``config.yaml``, which is never rewritten). Used by :func:`vlbert.recipes.run`
(:mod:`vlbert.recipes.runner`), whose first two steps these are.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from vlbert.common.typed_config import check_mapping
from vlbert.common.user_files import read_yaml
from vlbert.config import BertConfig, VLBertConfig
from vlbert.detectors.config import DetectorConfig
from vlbert.training.checkpointing import latest_checkpoints
from vlbert.training.run_config import check_sections, dataclass_from_section
from vlbert.training.trainer import TrainingConfig
from vlbert.utils import process_position

if TYPE_CHECKING:  # annotations only: the runner imports this module
    from vlbert.recipes.runner import Recipe

logger = logging.getLogger(__name__)

#: The top-level keys every task's run config may have (a recipe adds its own ``sections``).
COMMON_SECTIONS = ("task", "modality", "init_from", "tokenizer", "model", "data", "training", "allow_other_detector")

#: The run's config as it started, written by the trainer into the output directory; a resumed run keeps it.
RUN_CONFIG_FILE = "config.yaml"
#: The keys a resumed run may change: how long it runs, where and how often it writes, how it loads its data; not
#: what it trains. The change is recorded in log.jsonl (a ``"split": "config"`` line); any other difference from
#: the run's config.yaml is refused (:func:`resume_changes`).
RESUMABLE_CHANGES = (
    "training.output_dir",
    "training.max_steps",
    "training.log_every",
    "training.eval_every",
    "training.save_every",
    "training.save_total_limit",
    "training.progress_bar",
    "training.num_workers",
    "training.collective_timeout",
    "data.max_eval_batches",
    "data.num_proc",
    "data.corpus_cache_dir",
    "data.cache_dir",
)
#: Config keys renamed since a run's ``config.yaml`` may have been written: the key as it was -> today's. A config
#: given now that uses the old key is refused in one line naming the new one (:func:`read_run_config`); a run's own
#: ``config.yaml``, which is never rewritten, is read under today's names when the run resumes
#: (:func:`resume_changes`), so that a run started before the rename continues.
RENAMED_KEYS = {"data.task": "data.dataset"}  # text fine-tuning's data reader: data.dataset, as every task's


@dataclass
class RunKeys:
    """The top-level values of a run config besides its sections (``model``, ``data``, ``training``, ``detector``,
    each read by its own type), read through the typed layer like every other value.

    task: the recipe's name (vlbert finetune); modality: "text" or "vl" (vlbert pretrain); init_from: a
    checkpoint directory, hub name or ``minilm``; tokenizer: a tokenizer directory or hub name (default: the one
    saved with init_from); allow_other_detector: fine-tune a vision-language init_from on regions of another
    detector than its own (:func:`check_init_regions`).
    """

    task: str | None = None
    modality: Literal["text", "vl"] | None = None
    init_from: str | None = None
    tokenizer: str | None = None
    allow_other_detector: bool = False


def _renamed_given(config: dict[str, Any]) -> list[tuple[str, str]]:
    """The (old, today's) pairs of :data:`RENAMED_KEYS` whose old key ``config`` sets."""
    return [
        (old, new)
        for old, new in RENAMED_KEYS.items()
        if isinstance(config.get(old.split(".")[0]), dict) and old.split(".")[1] in config[old.split(".")[0]]
    ]


def with_todays_names(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` (a run's recorded ``config.yaml``) with each key of :data:`RENAMED_KEYS` it sets under
    today's name (where both are set, today's is kept)."""
    out = dict(config)
    for old, new in _renamed_given(config):
        (section, key), (new_section, new_key) = old.split("."), new.split(".")
        out[section] = {k: v for k, v in out[section].items() if k != key}
        out[new_section] = {new_key: config[section][key], **(out.get(new_section) or {})}
    return out


def same_value(a, b) -> bool:
    """Whether two config values are the same: numbers by value (``1e-4`` written as text equals 0.0001), anything
    else by ``==``."""
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return a == b


def model_config_class(recipe: Recipe) -> type:
    """The config class of the ``model`` section of ``recipe``'s runs: :class:`~vlbert.config.VLBertConfig` for
    the tasks with regions, else :class:`~vlbert.config.BertConfig`."""
    return VLBertConfig if recipe.uses_regions else BertConfig


def read_model_section(recipe: Recipe, section: Any) -> dict[str, Any]:
    """The given keys of ``recipe``'s ``model`` section, checked and converted: by the recipe's own reader
    (:attr:`~vlbert.recipes.runner.Recipe.read_model_section`), else as :func:`model_config_class`'s fields.

    Raises:
        ValueError: an unknown key, a value of the wrong type or out of range (one line naming the key).
    """
    if recipe.read_model_section is not None:
        return recipe.read_model_section(section)
    return check_mapping(model_config_class(recipe), section, "model")


def read_run_config(recipe: Recipe, config: dict[str, Any]) -> tuple[TrainingConfig, Any, Any]:
    """Read every value of ``config`` through its type (:mod:`vlbert.common.typed_config`), building nothing: the
    top-level keys (:class:`RunKeys`, and none unknown), ``training``, ``data`` (the recipe's data config),
    ``detector`` (recipes with regions) and the ``model`` section's given keys (the model config's fields, its
    ``visual_backbone`` included; the architecture's consistency is checked when the model is built). The
    ``model`` section of an ``implementation: transformers`` run is transformers' to read.

    Returns:
        (training config, data config, detector config or None).
    Raises:
        ValueError: an unknown key, a value of the wrong type or out of range: one line naming the key, what it
            got and what it takes; a key of :data:`RENAMED_KEYS` under its old name (today's named).
        (A warm-up longer than the run is warned of, not refused: :func:`warn_of_a_warmup_past_the_end`.)
    """
    renamed = _renamed_given(config)
    if renamed:
        (old, new), (section, key) = renamed[0], renamed[0][0].split(".")
        raise ValueError(f"{old} is now {new}: rename it in the config ({new}: {config[section][key]})")
    check_sections(config, COMMON_SECTIONS + (("detector",) if recipe.uses_regions else ()) + recipe.sections)
    keys = {f.name for f in dataclasses.fields(RunKeys)}
    check_mapping(RunKeys, {k: v for k, v in config.items() if k in keys}, "")
    training = TrainingConfig.from_dict(config.get("training"))
    warn_of_a_warmup_past_the_end(training)
    data_config = dataclass_from_section(recipe.data_config, config.get("data"), "data")
    detector = DetectorConfig.from_section(config.get("detector")) if recipe.uses_regions else None
    if config.get("implementation", "vlbert") != "transformers":
        read_model_section(recipe, config.get("model"))
    return training, data_config, detector


def warn_of_a_warmup_past_the_end(training: TrainingConfig) -> None:
    """Log one warning where ``training.warmup_steps`` exceeds ``training.max_steps``: the learning rate then never
    reaches ``training.learning_rate`` (the linear warm-up is cut off at max_steps / warmup_steps of it)."""
    warmup, steps = getattr(training, "warmup_steps", 0), training.max_steps
    if warmup > steps and process_position()[0] == 0:
        logger.warning(
            "training.warmup_steps (%d) is larger than training.max_steps (%d): the learning rate never reaches "
            "training.learning_rate (it peaks at %.0f%% of it); lower it, e.g. --set training.warmup_steps=%d",
            warmup,
            steps,
            100 * steps / warmup,
            max(1, steps // 10),
        )


def _effective(recipe: Recipe, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` flattened to ``section.key`` -> value, the typed sections with their defaults filled (an entry
    spelled out at its default equals one left out; ``1e-4`` equals ``0.0001``). A section this version cannot
    read (a config.yaml of another version) is compared as written."""
    readers = {
        "training": lambda v: dataclasses.asdict(TrainingConfig.from_dict(v)),
        "data": lambda v: dataclasses.asdict(dataclass_from_section(recipe.data_config, v, "data")),
        "model": lambda v: read_model_section(recipe, v),
    }
    if recipe.uses_regions:
        readers["detector"] = lambda v: dataclasses.asdict(DetectorConfig.from_section(v))
    out: dict[str, Any] = {}
    for key in sorted(set(config) | set(readers) - {"model"}):
        value = config.get(key)
        if key in readers:
            with contextlib.suppress(ValueError, TypeError):
                value = readers[key](value)
        if isinstance(value, dict) and key in readers:
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    out["init_from"] = config.get("init_from") or recipe.default_init  # the checkpoint the run starts from
    return out


def resume_changes(recipe: Recipe, config: dict[str, Any], output_dir: str | Path) -> dict[str, tuple[Any, Any]]:
    """What ``config`` changes against the run it resumes: its ``config.yaml`` (written when the run started, and
    never rewritten), where the output directory holds one and a checkpoint to resume from. The keys of
    :data:`RESUMABLE_CHANGES` may change (returned, ``key -> (recorded, now)``, for the run's log); any other
    difference (a recorded key of :data:`RENAMED_KEYS` compared under today's name) is refused, since the checkpoint's steps were trained with the recorded values and the run would
    mix two recipes under one record.

    Raises:
        ValueError: a key outside :data:`RESUMABLE_CHANGES` differs (every such key named, with both values).
    """
    directory = Path(output_dir)
    path = directory / RUN_CONFIG_FILE
    if not path.is_file() or not latest_checkpoints(directory):
        return {}
    recorded = (
        read_yaml(
            path, "run's config", "it is the record the trainer wrote; restore it from a checkpoint's config.yaml"
        )
        or {}
    )
    if not isinstance(recorded, dict):
        raise ValueError(
            f"{path} must hold a YAML mapping (the run's config), got {type(recorded).__name__}; "
            "restore it from a checkpoint's config.yaml"
        )
    before, now = _effective(recipe, with_todays_names(recorded)), _effective(recipe, config)
    missing = "(not set)"
    changed = {
        k: (before.get(k, missing), now.get(k, missing))
        for k in sorted(set(before) | set(now))
        if not same_value(before.get(k, missing), now.get(k, missing))
    }
    refused = [k for k in changed if k not in RESUMABLE_CHANGES]
    if refused:
        differences = "; ".join(f"{k}: {changed[k][0]!r} -> {changed[k][1]!r}" for k in refused)
        raise ValueError(
            f"--resume: this config differs from the one the run in {directory} started with ({path}): {differences}; "
            "a run continues with its own config: undo these changes (--set them back), or train a new run in "
            f"another --output-dir (--init-from one of its checkpoints); only {', '.join(RESUMABLE_CHANGES)} may "
            "change on --resume"
        )
    return changed


def record_resume_changes(output_dir: str | Path, step: int, changes: dict[str, tuple[Any, Any]]) -> None:
    """Append the allowed config changes of a resumed run to its ``log.jsonl`` (main process): one line
    ``{"split": "config", "step": <resumed step>, "changed": {key: [recorded, now]}}``, and one log line."""
    if not changes:
        return
    logger.warning(
        "--resume at step %d with config changes %s (recorded in log.jsonl; %s keeps the run's first config)",
        step,
        ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changes.items()),
        RUN_CONFIG_FILE,
    )
    if process_position()[0] != 0:
        return
    record = {"split": "config", "step": step, "changed": {k: [a, b] for k, (a, b) in changes.items()}}
    with open(Path(output_dir) / "log.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=str) + "\n")


__all__ = [
    "COMMON_SECTIONS",
    "RUN_CONFIG_FILE",
    "RESUMABLE_CHANGES",
    "RENAMED_KEYS",
    "RunKeys",
    "model_config_class",
    "read_model_section",
    "same_value",
    "with_todays_names",
    "read_run_config",
    "warn_of_a_warmup_past_the_end",
    "resume_changes",
    "record_resume_changes",
]
