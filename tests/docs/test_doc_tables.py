"""The lists in the docs cannot drift from the code: docs/architecture.md's "The tables" section names every entry of
every extension table (tasks, pipelines, commands, objectives, region pathways, encoders, checkpoint families,
attention kernels, text pretraining's architectures, optimizers, learning-rate schedules and decay shapes, detector backends, benchmarks, each task's
datasets), exactly, and every table is there."""

from __future__ import annotations

import importlib
import re

import pytest
from helpers.builders import ROOT

#: every extension table: (module, name). A new table is one line here and one line in the docs.
TABLES = [
    ("vlbert.recipes.tasks", "TASKS"),
    ("vlbert.inference.pipelines", "PIPELINES"),
    ("vlbert.commands", "COMMANDS"),
    ("vlbert.objectives.registry", "OBJECTIVES"),
    ("vlbert.models.region_embeddings", "REGION_EMBEDDINGS"),
    ("vlbert.models.vl", "ENCODERS"),
    ("vlbert.families.registry", "FAMILIES"),
    ("vlbert.layers.attention", "ATTENTION_FUNCTIONS"),
    ("vlbert.recipes.text_pretraining", "ARCHITECTURES"),
    ("vlbert.training.optimizers", "OPTIMIZERS"),
    ("vlbert.training.schedules", "SCHEDULES"),
    ("vlbert.training.wsd", "DECAY_SHAPES"),
    ("vlbert.detectors.backends", "DETECTOR_BACKENDS"),
    ("vlbert.detectors.grid", "GRID_BACKBONES"),
    ("benchmarks", "BENCHMARKS"),
    ("vlbert.recipes.vqa", "DATASETS"),
    ("vlbert.recipes.retrieval", "DATASETS"),
    ("vlbert.recipes.nlvr2", "DATASETS"),
    ("vlbert.recipes.visual_entailment", "DATASETS"),
    ("vlbert.recipes.referring_expressions", "DATASETS"),
]
LINE = re.compile(r"^- `(?P<module>[\w.]+)\.(?P<name>[A-Z_]+)`: (?P<keys>.*)$")


def documented() -> dict[tuple[str, str], list[str]]:
    """(module, table) -> the entries docs/architecture.md lists under "## The tables"."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("\n## The tables\n", 1)[1].split("\n## ", 1)[0]
    found = {}
    for line in section.splitlines():
        m = LINE.match(line)
        if m:
            found[m["module"], m["name"]] = re.findall(r"`([^`]+)`", m["keys"])
    return found


def doc_line(module: str, name: str) -> str:
    """The line the docs should carry for a table (pasted from a failure's message)."""
    keys = list(getattr(importlib.import_module(module), name))
    return f"- `{module}.{name}`: " + ", ".join(f"`{k}`" for k in keys)


def test_every_table_is_in_the_docs_and_nothing_else():
    assert set(documented()) == set(TABLES), "\n".join(doc_line(*t) for t in TABLES)


@pytest.mark.parametrize("module,name", TABLES, ids=[f"{m}.{n}" for m, n in TABLES])
def test_the_docs_list_every_entry_of_the_table(module, name):
    keys = list(getattr(importlib.import_module(module), name))
    assert documented().get((module, name)) == keys, f"docs/architecture.md should say:\n{doc_line(module, name)}"
