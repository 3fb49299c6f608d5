"""One recipe per task (see :mod:`vlbert.recipes.runner`), each a line of the task table :data:`TASKS`
(:mod:`vlbert.recipes.tasks`). ``RECIPES`` is its view task name -> recipe (the ``task:`` key of a run config,
``--task`` of ``vlbert finetune``)."""

from vlbert.recipes.init_from import load_model
from vlbert.recipes.runner import Recipe, RunContext, TaskData, run
from vlbert.recipes.tasks import TASKS, Task, TaskView
from vlbert.training.run_directory import RunExistsError

#: task name -> its :class:`Recipe`: a live, read-only view of :data:`TASKS`.
RECIPES: TaskView = TaskView(lambda task: task.recipe)

__all__ = [
    "TASKS",
    "Task",
    "TaskView",
    "RECIPES",
    "Recipe",
    "RunContext",
    "TaskData",
    "RunExistsError",
    "run",
    "load_model",
]
