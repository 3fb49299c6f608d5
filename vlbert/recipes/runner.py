"""One runner for every task: a :class:`Recipe` says what is particular to a task (its data section, how to
build its data, model and evaluation); :func:`run` does the wiring every task shares, in one order:

1. check the run config (top-level keys, ``training``, ``data``, ``detector``, ``model``: every value through the
   typed reading of :mod:`vlbert.common.typed_config`) before anything is built or written;
2. refuse an output directory that holds a run unless ``resume`` or ``overwrite`` says what to do with it, and a
   ``resume`` whose config differs from the run's own ``config.yaml`` (:func:`resume_changes`), and (once the data
   is built) one whose data files or labels differ from the run's record (:mod:`vlbert.recipes.run_data`);
3. resolve ``init_from`` (``minilm`` = the packaged BERT) and load the tokenizer (``tokenizer``, else the one
   saved with ``init_from``, else the packaged vocabulary);
4. build the data, seed, build the model and check that the tokenizer fits it;
5. train (resuming from the newest checkpoint when asked), with the recipe's baselines and final evaluation
   written to ``metrics.json``.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from vlbert.common.files import write_text_atomically
from vlbert.data.loading import eval_loader, train_loader
from vlbert.evaluation.predictions import HeldOutPredictions, Keep
from vlbert.processing import VLProcessor
from vlbert.recipes.config_reading import (
    read_run_config,
    record_resume_changes,
    resume_changes,
)
from vlbert.recipes.run_data import data_fingerprint, refuse_changed_data, write_data_record
from vlbert.recipes.run_processor import build_run_processor
from vlbert.run_files import CHECKPOINTS_DIR
from vlbert.tokenization import check_tokenizer_matches, load_tokenizer, resolve_model_path
from vlbert.training.processes import check_shared_output_dir, collective_failure, control_plane, start_processes
from vlbert.training.run_directory import prepare_output_dir, record_run_files, refuse_resuming_a_finished_run
from vlbert.training.trainer import Trainer, TrainingConfig
from vlbert.training.training_config import set_seed
from vlbert.utils import process_position

logger = logging.getLogger(__name__)


@dataclass
class RunContext:
    """What a recipe's builders receive: the parsed sections and the shared objects.

    Attributes:
        config: the whole run config (dict, as resolved from YAML and overrides).
        training: :class:`TrainingConfig`; data: the recipe's data config; detector: a
            :class:`vlbert.detectors.config.DetectorConfig` for recipes with regions, else None.
        tokenizer: the fast WordPiece tokenizer; init_from: the resolved checkpoint path, or None (from scratch).
        command_line_keys: the dotted config keys the user set on the command line (flags and ``--set``).
        recipe: the task's :class:`Recipe` (its name, pipeline and processor fields: the run's processor,
            :func:`~vlbert.recipes.run_processor.build_run_processor`), or None (data built outside a run).
    """

    config: dict[str, Any]
    training: TrainingConfig
    data: Any
    detector: Any
    tokenizer: Any
    init_from: str | None
    command_line_keys: tuple[str, ...] = ()
    recipe: Any = None

    @property
    def model_section(self) -> dict[str, Any]:
        return dict(self.config.get("model") or {})


@dataclass(frozen=True)
class Recipe:
    """A task: its data config type and three builders (see module docstring).

    Attributes:
        name: the task's name (``RECIPES`` key).
        data_config: the dataclass of the ``data`` section.
        build_data: ``RunContext -> TaskData``.
        build_model: ``(RunContext, TaskData) -> model`` (a model of :mod:`vlbert.models`).
        evaluate: ``(RunContext, TaskData, model) -> metrics`` on the trained model, or None.
        baselines: ``(RunContext, TaskData, model) -> metrics`` before training (majority class, the untrained
            model), or None.
        uses_regions: the run config has a ``detector`` section.
        default_init: ``init_from`` when the config names none (None: a fresh model from the ``model`` section).
        sections: top-level keys the recipe reads besides :data:`COMMON_SECTIONS`.
        processor_fields: ``(RunContext, TaskData) -> dict``, the task's own fields of the run's processor record
            (label names, retrieval's shortlist, ...: read as :meth:`vlbert.processing.VLProcessor.from_record`
            reads a record), or None. Where the task's data built the run's processor (``data.processor``: the
            region tasks, whose datasets and collator it made) they are set on it; else they are the whole record
            (a text task: maximum length, labels). The processor is saved as ``processor.json`` in the output
            directory (the pipelines read it): :func:`run_processor`.
        pipeline: the name of the task's inference pipeline (a key of :data:`vlbert.inference.PIPELINES`),
            recorded in ``processor.json``; None where the task has none.
        hooks: ``(RunContext, TaskData, model) -> list of TrainerHook`` the task's config asks for (VL
            pretraining's momentum model), run before the caller's; or None.
        read_model_section: ``model section -> dict``, the recipe's own reading of its ``model`` section (its
            given keys checked and converted; text pretraining: the architecture it names, then that
            architecture's config fields), or None: the fields of :func:`~vlbert.recipes.config_reading.model_config_class`.
    """

    name: str
    data_config: type
    build_data: Callable
    build_model: Callable
    evaluate: Callable | None = None
    baselines: Callable | None = None
    uses_regions: bool = False
    default_init: str | None = "minilm"
    sections: tuple[str, ...] = field(default=())
    processor_fields: Callable | None = None
    pipeline: str | None = None
    hooks: Callable | None = None
    read_model_section: Callable | None = None


class TaskData:
    """Training and held-out data of one task, and their batches. Subclasses set ``train``, ``eval`` (or None)
    and ``collator`` in ``__init__`` (after calling this one); ``objectives`` (an ObjectiveMix) where batches
    carry one objective each."""

    train_drop_last = True
    eval_batch_factor = 2  # evaluation needs no gradients: larger batches
    objectives = None
    #: ``optimizer step -> dict`` of fields every item of that step's training batches carries (text pretraining:
    #: the masking rate of a schedule; :func:`~vlbert.data.loading.train_loader`), or None
    step_fields = None

    def __init__(self, ctx: RunContext):
        self.batch_size, self.seed = ctx.training.batch_size, ctx.training.seed
        self.loader_options = ctx.training.loader_options()
        self.max_eval_batches = 0
        self.eval = None

    def train_batches(self, epoch: int, start: int, rank: int, world_size: int):
        """Batches of ``epoch`` from batch index ``start`` on, for one data-parallel rank."""
        return train_loader(
            self.train,
            self.collator,
            self.batch_size,
            self.seed,
            epoch,
            start,
            rank,
            world_size,
            drop_last=self.train_drop_last,
            objectives=self.objectives,
            step_fields=self.step_fields,
            **self.loader_options,
        )

    def eval_batches(self, rank: int = 0, world_size: int = 1):
        """Every held-out item once in fixed batches (once per objective where batches carry one); with
        ``world_size`` > 1, this ``rank``'s share of them (:func:`~vlbert.data.loading.eval_loader`)."""
        size = self.eval_batch_factor * self.batch_size
        share = {"rank": rank, "world_size": world_size}
        if self.objectives is None:
            yield from eval_loader(self.eval, self.collator, size, self.max_eval_batches, **share)
            return
        for name in self.objectives.active:
            yield from eval_loader(self.eval, self.collator, size, self.max_eval_batches, objective=name, **share)

    def rank_eval_batches(self):
        """This process's share of :meth:`eval_batches` (all of them in a single process): a task's evaluation
        runs on 1/N of the items per rank and gathers the results (accelerate's ``gather_object``)."""
        rank, world_size = process_position()
        return self.eval_batches(rank, world_size)

    # A task whose evaluation reads the model's outputs on the held-out batches defines ``keep`` (and names its
    # batches' ``target_keys``); it then reads them with :meth:`predictions`, which takes them from the trainer's
    # final held-out pass: one forward per batch at the end of a run serves the objectives' held-out losses and the
    # task's predictions.
    keep: Keep | None = None
    #: the batch keys that hold the targets (labels), left out of a prediction pass of :meth:`predictions`' own
    target_keys: tuple[str, ...] = ()
    _final_pass: HeldOutPredictions | None = None

    def prediction_inputs(self, batch: dict) -> dict:
        """What the model is given of a held-out ``batch`` in a pass of :meth:`predictions`' own: every entry but
        the bookkeeping ``index`` and the :attr:`target_keys` (no loss to compute)."""
        return {k: v for k, v in batch.items() if k != "index" and k not in self.target_keys}

    def held_out_predictions(self) -> HeldOutPredictions | None:
        """A collector of :attr:`keep`'s values for the trainer to fill during its final held-out pass, read by the
        next :meth:`predictions`; None where the task keeps nothing."""
        self._final_pass = HeldOutPredictions(self.keep) if self.keep is not None else None
        return self._final_pass

    def predictions(self, model) -> dict[int, Any]:
        """:attr:`keep`'s value for every held-out example, gathered from every process, by dataset index: those
        the trainer's final held-out pass kept (:meth:`held_out_predictions`; read once), else from a pass of
        ``model`` over :meth:`rank_eval_batches` (in eval mode, without gradients)."""
        kept, self._final_pass = self._final_pass, None
        if kept is None or not kept.finished:
            kept = HeldOutPredictions(self.keep).run(model, self.rank_eval_batches(), self.prediction_inputs)
        return kept.gathered()


def write_output_file(ctx: "RunContext", name: str, text: str) -> Path:
    """Write ``text`` to ``name`` in the run's output directory, atomically (a predictions file is never seen half
    written), once: by the main process only, and record it as the run's (``run_files.json``). Returns its path."""
    path = Path(ctx.training.output_dir) / name
    if process_position()[0] == 0:
        write_text_atomically(path, text)
        record_run_files(ctx.training.output_dir, [name])
    return path


def run_processor(ctx: RunContext, data: TaskData) -> VLProcessor | None:
    """The processor the run saves as processor.json: the one its data was built with (``data.processor``: every
    vision-language task's), else, for a task whose recipe has :attr:`Recipe.processor_fields` (the text tasks),
    :func:`~vlbert.recipes.run_processor.build_run_processor` of them; None where it has neither.

    Raises:
        ValueError: from :func:`~vlbert.recipes.run_processor.build_run_processor`."""
    own = getattr(data, "processor", None)
    if own is not None or ctx.recipe is None or ctx.recipe.processor_fields is None:
        return own
    return build_run_processor(ctx, data)


def run(
    recipe: Recipe,
    config: dict[str, Any],
    resume: bool = False,
    overwrite: bool = False,
    command_line_keys: tuple[str, ...] = (),
    hooks: Sequence = (),
) -> dict[str, Any]:
    """Train and evaluate ``recipe`` as ``config`` says; returns the final metrics (also in metrics.json).
    ``command_line_keys``: the dotted keys the user set on the command line (see :class:`RunContext`).
    ``hooks``: :class:`~vlbert.training.hooks.TrainerHook` s for the trainer (a throughput meter, an EMA, ...).

    Raises:
        ValueError / FileNotFoundError: bad config keys or values (:func:`read_run_config`), a ``resume`` whose
            config differs from the run's (:func:`resume_changes`) or whose data changed
            (:func:`~vlbert.recipes.run_data.refuse_changed_data`), missing data, a tokenizer that does not fit
            the model, ...: all raised before any file is written.
        RunExistsError: see :func:`~vlbert.training.run_directory.prepare_output_dir`.
        vlbert.training.trainer.TrainingPreempted: SIGTERM; a checkpoint was written.
    """
    training, data_config, detector = read_run_config(recipe, config)
    start_processes(training.collective_timeout)
    init = config.get("init_from") or recipe.default_init
    init_from = resolve_model_path(init) if init else None  # a mistyped path refused before --overwrite deletes
    fresh = not Path(training.output_dir).exists()
    check_shared_output_dir(training.output_dir, control_plane(training.collective_timeout))
    prepare_output_dir(training.output_dir, resume, overwrite)
    changes = resume_changes(recipe, config, training.output_dir) if resume else {}
    if resume:
        refuse_resuming_a_finished_run(training.output_dir, training.max_steps)
    tokenizer = load_tokenizer(resolve_model_path(config.get("tokenizer") or init_from))
    ctx = RunContext(config, training, data_config, detector, tokenizer, init_from, tuple(command_line_keys), recipe)
    data = recipe.build_data(ctx)
    processor = run_processor(ctx, data)
    trained_on = data_fingerprint(data_config, processor.labels if processor is not None else None)
    if resume:  # the data the run started with, or one line naming what changed (before anything is written)
        refuse_changed_data(training.output_dir, trained_on)
    set_seed(training.seed)  # initial weights depend on the seed alone
    model = recipe.build_model(ctx, data)
    if getattr(model, "config", None) is not None:  # vlbert models (not the transformers comparison adapter)
        check_tokenizer_matches(tokenizer, model.config)
    logger.info(
        "%s: %.1fM parameters; %d training items, %d held-out",
        recipe.name,
        sum(p.numel() for p in model.parameters()) / 1e6,
        len(data.train),
        len(data.eval) if data.eval is not None else 0,
    )
    trainer = None
    try:
        trainer = Trainer(
            model,
            training,
            data.train_batches,
            data.eval_batches if data.eval is not None else None,
            run_config=config,
            tokenizer=tokenizer,
            hooks=[*(recipe.hooks(ctx, data, model) if recipe.hooks else ()), *hooks],
        )
        if resume and not trainer.resume():
            logger.warning(
                "--resume: no checkpoint under %s/%s; starting from step 0", training.output_dir, CHECKPOINTS_DIR
            )
        elif resume:
            record_resume_changes(training.output_dir, trainer.step, changes)
        if processor is not None:  # the trainer saves the tokenizer with the weights
            processor.save_pretrained(training.output_dir, save_tokenizer_files=False)
        write_data_record(training.output_dir, trained_on)
        record_run_files(training.output_dir)
        extra = recipe.baselines(ctx, data, trainer.unwrapped) if recipe.baselines else {}
        final = (lambda model: recipe.evaluate(ctx, data, model)) if recipe.evaluate else None
        kept = data.held_out_predictions() if recipe.evaluate and data.eval is not None else None
        return trainer.train(extra_metrics=extra, final_metrics=final, final_outputs=kept)
    except (ValueError, OSError, ModuleNotFoundError):
        # Refused before its first step: the directory this run made holds no run (nothing to resume), so it goes,
        # and the corrected command is not refused with "already holds a run".
        if fresh and (trainer is None or trainer.step == 0) and process_position()[0] == 0:
            shutil.rmtree(training.output_dir, ignore_errors=True)
        raise
    except RuntimeError as e:  # a collective of several processes that timed out or lost a peer: one line
        failure = collective_failure(e)
        if failure is None:
            raise
        raise failure from e


__all__ = [
    "Recipe",
    "RunContext",
    "TaskData",
    "run",
    "run_processor",
    "write_output_file",
]
