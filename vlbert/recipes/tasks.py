"""The task table: one :class:`Task` per task, the one place a task is keyed.

A task's entry names its recipe (data config type, data / model builders, evaluation: :class:`Recipe`), the
inference pipeline its runs answer with (the recipe's ``pipeline``, a key of
:data:`vlbert.inference.PIPELINES`), the shipped config it runs without ``--config``, the ``vlbert`` command that
trains it and the script in ``tools/`` that is that command with the task fixed. The other tables are views of
this one: :data:`vlbert.recipes.RECIPES` (task -> recipe), :data:`vlbert.commands.finetune.DEFAULT_CONFIGS`
(task -> default config) and :data:`vlbert.commands.SCRIPTS` (tools/ script -> command line).

A new task is one recipe module (``vlbert/recipes/<task>.py`` with its ``RECIPE``) and one line in :data:`TASKS`
(docs/extending.md). The table sits at the recipes' level (tools -> commands -> recipes): it names commands and
pipelines by their names only, and imports neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterator

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
            ``--task`` of ``vlbert finetune``, the ``task`` of the run's processor.json).
        default_config: the shipped config (a name under ``configs/``, see :mod:`vlbert.training.run_config`) the
            task runs without ``--config``.
        command: the ``vlbert`` command that trains it (``finetune`` or ``pretrain``).
        argv: that command's flags that select this task (``--task vqa``, ``--modality text``).
        script: the script in ``tools/`` (file name without ``.py``) that is ``vlbert <command> <argv>``, or None.
        dataset_flag_key: the ``data`` config key that ``--dataset`` sets for this task (its data reader).
    """

    recipe: Recipe
    default_config: str
    command: str = "finetune"
    argv: tuple[str, ...] = ()
    script: str | None = None
    dataset_flag_key: str = "data.dataset"

    @property
    def name(self) -> str:
        """The task's name: its recipe's."""
        return self.recipe.name

    @property
    def pipeline(self) -> str | None:
        """The name of the inference pipeline its runs answer with (a key of :data:`vlbert.inference.PIPELINES`,
        recorded in the run's processor.json), or None where it has none."""
        return self.recipe.pipeline

    @property
    def command_line(self) -> tuple[str, ...]:
        """``vlbert`` arguments that run this task: the command and the flags that select it."""
        return (self.command, *(self.argv or ("--task", self.name)))


#: task name -> its :class:`Task`; one line per task.
TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(TEXT_PRETRAINING, "text/default", "pretrain", ("--modality", "text")),
        Task(VL_PRETRAINING, "vl/default", "pretrain", ("--modality", "vl")),
        Task(TEXT, "finetune/bbc-news", script="finetune_text", dataset_flag_key="data.task"),
        Task(VQA, "finetune/vqa-easy-vqa", script="finetune_vqa"),
        Task(RETRIEVAL, "finetune/retrieval-easy-vqa", script="finetune_retrieval"),
        Task(VISUAL_ENTAILMENT, "finetune/snli-ve-easy-vqa"),
        Task(NLVR2, "finetune/nlvr2-easy-vqa", script="finetune_nlvr2"),
        Task(REFCOCO, "finetune/refcoco-easy-vqa"),
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
