"""One recipe per task (see :mod:`vlbert.recipes.runner`); ``RECIPES`` maps a task name (the ``task:`` key of a
fine-tuning config, ``--task`` of ``tools/finetune.py``) to its recipe."""

from vlbert.recipes.nlvr2 import RECIPE as NLVR2
from vlbert.recipes.referring_expressions import RECIPE as REFCOCO
from vlbert.recipes.retrieval import RECIPE as RETRIEVAL
from vlbert.recipes.runner import Recipe, RunContext, RunExistsError, TaskData, load_model, run
from vlbert.recipes.text_classification import RECIPE as TEXT
from vlbert.recipes.text_pretraining import RECIPE as TEXT_PRETRAINING
from vlbert.recipes.visual_entailment import RECIPE as VISUAL_ENTAILMENT
from vlbert.recipes.vl_pretraining import RECIPE as VL_PRETRAINING
from vlbert.recipes.vqa import RECIPE as VQA

RECIPES: dict[str, Recipe] = {
    r.name: r for r in (TEXT_PRETRAINING, VL_PRETRAINING, TEXT, VQA, RETRIEVAL, VISUAL_ENTAILMENT, NLVR2, REFCOCO)
}

__all__ = ["RECIPES", "Recipe", "RunContext", "TaskData", "RunExistsError", "run", "load_model"]
