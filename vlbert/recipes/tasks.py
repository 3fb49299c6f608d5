"""The task table: one :class:`Task` per task, the one place a task is keyed.

A task's entry names its recipe (data config type, data / model builders, evaluation: :class:`Recipe`), the
inference pipeline class its runs answer with, the shipped config it runs without ``--config``, the ``vlbert``
command that trains it and the script in ``tools/`` that is that command with the task fixed. The other tables are
views of this one: :data:`vlbert.recipes.RECIPES` (task -> recipe), :data:`vlbert.commands.finetune.DEFAULT_CONFIGS`
(task -> default config) and :data:`vlbert.commands.SCRIPTS` (tools/ script -> command line); the name the run's
processor.json records is the pipeline class's own (:attr:`Pipeline.name`), given to the recipe by its entry.

A new task is one recipe module (``vlbert/recipes/<task>.py`` with its ``RECIPE``) and one line in :data:`TASKS`
(docs/extending.md). The table sits at the recipes' level (tools -> commands -> recipes -> inference): it names
commands by their names only, and imports the pipeline classes from :mod:`vlbert.inference`, which imports neither
the recipes nor the trainer. So :data:`vlbert.inference.PIPELINES` cannot be a view of this table: it is the
catalogue of pipelines by name that ``vlbert.inference`` reads a run's processor.json with on its own, and a task's
pipeline must be in it (:class:`Task` checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

from vlbert.inference import (
    PIPELINES,
    EntailmentPipeline,
    FillMaskPipeline,
    ImagePairPipeline,
    Pipeline,
    ReferringPipeline,
    RetrievalPipeline,
    TextClassificationPipeline,
    TextFillMaskPipeline,
    VQAPipeline,
)
from vlbert.recipes.nlvr2 import RECIPE as NLVR2
from vlbert.recipes.referring_expressions import RECIPE as REFCOCO
from vlbert.recipes.retrieval import RECIPE as RETRIEVAL
from vlbert.recipes.runner import Recipe
from vlbert.recipes.text_classification import RECIPE as TEXT
from vlbert.recipes.text_pretraining import RECIPE as TEXT_PRETRAINING
from vlbert.recipes.visual_entailment import RECIPE as VISUAL_ENTAILMENT
from vlbert.recipes.vl_pretraining import RECIPE as VL_PRETRAINING
from vlbert.recipes.vqa import RECIPE as VQA


@dataclass(frozen=True)
class Task:
    """One task: everything that is keyed by its name.

    Attributes:
        recipe: the task's :class:`Recipe` (its ``name`` is the task's name: the ``task:`` key of a run config,
            ``--task`` of ``vlbert finetune``, the ``task`` of the run's processor.json), as the table runs it: with
            ``pipeline`` set to :attr:`pipeline`'s name, which the runner records in processor.json.
        pipeline: the :class:`~vlbert.inference.Pipeline` subclass its runs answer with (``pipeline(run)`` picks
            it by the recorded name), or None where the task has none.
        default_config: the shipped config (a name under ``configs/``, see :mod:`vlbert.training.run_config`) the
            task runs without ``--config``.
        command: the ``vlbert`` command that trains it (``finetune`` or ``pretrain``).
        argv: that command's flags that select this task (``--task vqa``, ``--modality text``).
        script: the script in ``tools/`` (file name without ``.py``) that is ``vlbert <command> <argv>``, or None.

    Raises:
        ValueError: a ``pipeline`` that :data:`vlbert.inference.PIPELINES` does not hold under its name (a run's
            processor.json could not be answered), or a recipe that names another pipeline than the entry.
    """

    recipe: Recipe
    pipeline: type[Pipeline] | None
    default_config: str
    command: str = "finetune"
    argv: tuple[str, ...] = ()
    script: str | None = None

    def __post_init__(self):
        named = None if self.pipeline is None else self.pipeline.name
        if self.pipeline is not None and PIPELINES.get(named) is not self.pipeline:
            raise ValueError(
                f"task {self.name!r} answers with {self.pipeline.__name__}, which vlbert.inference.PIPELINES does "
                f"not hold under its name {named!r}: add its line there (pipeline(run) finds a run's pipeline by "
                "the name its processor.json records)"
            )
        if self.recipe.pipeline not in (None, named):
            raise ValueError(
                f"task {self.name!r}: its recipe names pipeline {self.recipe.pipeline!r}, its entry {named!r}; "
                "name the pipeline in the task's entry only"
            )
        object.__setattr__(self, "recipe", replace(self.recipe, pipeline=named))

    @property
    def name(self) -> str:
        """The task's name: its recipe's."""
        return self.recipe.name

    @property
    def command_line(self) -> tuple[str, ...]:
        """``vlbert`` arguments that run this task: the command and the flags that select it."""
        return (self.command, *(self.argv or ("--task", self.name)))


#: task name -> its :class:`Task`; one line per task.
TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(TEXT_PRETRAINING, TextFillMaskPipeline, "text/default", "pretrain", ("--modality", "text")),
        Task(VL_PRETRAINING, FillMaskPipeline, "vl/default", "pretrain", ("--modality", "vl")),
        Task(TEXT, TextClassificationPipeline, "finetune/bbc-news", script="finetune_text"),
        Task(VQA, VQAPipeline, "finetune/vqa-easy-vqa", script="finetune_vqa"),
        Task(RETRIEVAL, RetrievalPipeline, "finetune/retrieval-easy-vqa", script="finetune_retrieval"),
        Task(VISUAL_ENTAILMENT, EntailmentPipeline, "finetune/snli-ve-easy-vqa"),
        Task(NLVR2, ImagePairPipeline, "finetune/nlvr2-easy-vqa", script="finetune_nlvr2"),
        Task(REFCOCO, ReferringPipeline, "finetune/refcoco-easy-vqa"),
    )
}


class TaskView(Mapping):
    """A read-only, live view of :data:`TASKS`: task name -> ``field(task)``, for the tasks ``keep`` keeps (all by
    default). A task added to :data:`TASKS` shows in every view; a view is never written to.

    Raises:
        KeyError: (on lookup) a name that is not a task, or one the view leaves out.
    """

    def __init__(self, field: Callable[[Task], Any], keep: Callable[[Task], bool] = lambda task: True):
        self._field, self._keep = field, keep

    def __getitem__(self, name: str) -> Any:
        task = TASKS[name]
        if not self._keep(task):
            raise KeyError(name)
        return self._field(task)

    def __iter__(self) -> Iterator[str]:
        return iter([name for name, task in TASKS.items() if self._keep(task)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return repr(dict(self))


__all__ = ["Task", "TASKS", "TaskView"]
