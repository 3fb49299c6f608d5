"""The documentation runs as written (issue 44): every ```python block of README.md and docs/*.md executes (on the
tiny runs of `doc_runs` and the easy-VQA images, with the user's paths substituted: :data:`PATHS`), and every
command line shown (code blocks and inline commands) parses with its tool: the tool's own argparse parser reads
the flags in-process and the tool stops there, and a ``--config`` that names a shipped config must resolve with
the ``--set`` overrides applied. A renamed flag, subcommand or config fails here instead of a reader."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
from pathlib import Path

import pytest
from helpers.builders import ROOT, tool

from benchmarks import main as benchmarks_main
from benchmarks import script_arguments
from vlbert.commands import command_main
from vlbert.commands import main as vlbert_main
from vlbert.processing import VLProcessor
from vlbert.recipes.report import results_table
from vlbert.training.run_config import config_dir, load_run_config

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`((?:python |vlbert |torchrun )[^`]*)`")

#: Placeholders the docs use for a user's files -> a fixture (a `doc_runs` run name, or an image of `easy`).
PATHS = {
    "runs/vqa-easy-vqa": "vqa-easy-vqa",
    "runs/mine": "vqa-easy-vqa",
    "runs/vl-default": "vl-default",
    "models/uniter-base": "vl-default",
    "runs/snli-ve-easy-vqa": "snli-ve-easy-vqa",
    "runs/nlvr2-easy-vqa": "nlvr2-easy-vqa",
    "runs/refcoco-easy-vqa": "refcoco-easy-vqa",
    "runs/retrieval-easy-vqa": "retrieval-easy-vqa",
    "runs/bbc-news": "bbc-news",
    "runs/text-default": "text-default",
    "photo.png": "image:0",
    "photo.jpg": "image:0",
    "a.png": "image:1",
    "b.png": "image:2",
    "left.png": "image:3",
    "right.png": "image:4",
    "photos/": "images",
}


def python_blocks() -> list[tuple[str, str]]:
    """(page, source) of every ```python block."""
    return [
        (page.relative_to(ROOT).as_posix(), m.group(2))
        for page in PAGES
        for m in FENCE.finditer(page.read_text(encoding="utf-8"))
        if m.group(1) == "python"
    ]


def command_lines() -> list[tuple[str, str]]:
    """(page, command) of every tool command shown: lines of indented and non-python fenced blocks (``\\``
    continuations joined, comments dropped) and inline `python tools/...` / `vlbert ...` code, where it is
    a whole command (no ``|``, ``[...]`` or ``...`` alternatives)."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        blocks = [m.group(2) for m in FENCE.finditer(text) if m.group(1) != "python"]
        prose = FENCE.sub("", text)
        blocks += [
            "\n".join(line[4:] for line in chunk.splitlines()) for chunk in re.findall(r"(?:^    .*\n?)+", prose, re.M)
        ]
        lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
        lines += [
            m.group(1)
            for m in INLINE.finditer(prose)  # whole commands, not names of one (`vlbert predict`)
            if not re.search(r"\\\||\[|\.\.\.|<|tools/X\.py", m.group(1)) and len(m.group(1).split()) > 2
        ]
        for line in lines:
            for part in line.split("&&"):
                if not part.strip().startswith(("python ", "vlbert ", "torchrun ", "accelerate ", "taskset ")):
                    continue
                words = shlex.split(part, comments=True)
                if _tool_words(words) is not None:
                    found.append((page.relative_to(ROOT).as_posix(), shlex.join(words)))
    return found


def _tool_words(words: list[str]):
    """(tool main, its argv) of a command's words, or None where it runs no vlbert tool (pip, pytest, ...)."""
    while words and words[0] in ("taskset", "-c", "0,1", "env") or (words and "=" in words[0]):
        words = words[1:]
    if words[:2] == ["accelerate", "launch"] or words[:1] == ["torchrun"]:
        scripts = [i for i, w in enumerate(words) if w.endswith(".py")]
        if not scripts:
            return None  # torchrun's own flags only (`torchrun --nnodes N`)
        words = ["python", *words[scripts[0] :]]
    if words[:1] == ["python"] and len(words) > 1 and words[1].startswith("tools/"):
        return "tools", words[1][len("tools/") : -len(".py")], words[2:]
    if words[:1] == ["vlbert"] and len(words) > 1:
        return ("vlbert", words[1], words[2:]) if not words[1].startswith("-") else ("vlbert", "", words[1:])
    if words[:3] == ["python", "-m", "vlbert"] and len(words) > 3:
        return "vlbert", words[3], words[4:]
    if words[:3] == ["python", "-m", "benchmarks"]:
        return "benchmarks", "", words[3:]
    return None


class Parsed(Exception):
    """Raised in place of running the tool once its parser has read the command line."""

    def __init__(self, namespace):
        super().__init__()
        self.namespace = namespace


@pytest.fixture
def parse_only(monkeypatch):
    """Parse a command line with its tool's own parser and stop: argparse's errors (status 2) fail the test."""
    real = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        raise Parsed(real(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    # the docs show commands for the machine they name (--device cuda on a GPU): a device's presence is not parsing
    monkeypatch.setattr("vlbert.commands.flag_types.missing_device", lambda name: None)

    def parse(command: str):
        kind, name, argv = _tool_words(shlex.split(command))
        if kind == "benchmarks" or (kind, name) == ("vlbert", "benchmark"):  # in a clone: python -m benchmarks
            main = benchmarks_main
        elif kind == "tools" and name.startswith("benchmark"):  # tools/benchmark*.py: the benchmarks package's
            fixed = script_arguments(f"{name}.py")
            main = lambda argv: benchmarks_main([*fixed, *argv])
        else:
            main = tool(name) if kind == "tools" else command_main(name) if name else vlbert_main
        argv = [w for w in argv if not w.startswith("...")]  # "...": the rest of a command said elsewhere
        if main is vlbert_main or (main is benchmarks_main and argv in (["-h"], ["--help"])):
            assert main(argv) == 0  # `vlbert --help`, `python -m benchmarks --help`: the usage, no parser
            return None
        with pytest.raises(Parsed) as parsed:
            main(argv)
        return parsed.value.namespace

    return parse


def _check_config(namespace) -> None:
    """A --config that names a shipped config (a name, or a path under configs/) resolves, --set applied."""
    config = getattr(namespace, "config", None)
    if config is None or not isinstance(config, str) or "<" in config:
        return
    shipped = config.removeprefix("configs/").removesuffix(".yaml")
    if (
        Path(config).is_file()
        or (config_dir() / f"{shipped}.yaml").is_file()
        or "/" in config
        and config.split("/")[0] in ("configs", "text", "vl", "finetune", "detectors")
    ):
        load_run_config(config, list(getattr(namespace, "set", None) or []))


COMMANDS = command_lines()


@pytest.mark.parametrize("page,command", COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in COMMANDS])
def test_every_command_line_shown_parses_with_its_tool(page, command, parse_only):
    _check_config(parse_only(command))


def test_the_docs_show_commands_of_every_tool():
    shown = {(_tool_words(shlex.split(c))[1]) for _, c in COMMANDS}
    assert {"pretrain", "finetune", "finetune_vqa", "predict", "extract_regions", "convert_checkpoint"} <= shown
    assert any(page == "README.md" for page, _ in COMMANDS)


def test_a_renamed_flag_fails_the_check(parse_only):
    parse_only("python tools/predict.py RUN --image photo.png --text hi --top-k 3")
    with pytest.raises(SystemExit):
        parse_only("python tools/predict.py RUN --image photo.png --text hi --topk 3")
    with pytest.raises(FileNotFoundError):
        _check_config(parse_only("python tools/finetune.py --config configs/finetune/no-such-recipe.yaml"))


def _substituted(source: str, runs: dict, easy, images_dir: Path) -> str:
    for placeholder, target in PATHS.items():
        if target == "images":
            path = images_dir
        elif target.startswith("image:"):
            path = easy.files[target.split(":")[1]]
        else:
            path = runs[target]
        source = source.replace(f'"{placeholder}"', repr(str(path)))
    return source


@pytest.mark.parametrize("page", sorted({p for p, _ in python_blocks()}))
def test_every_python_block_runs(page, doc_runs, easy, tmp_path, monkeypatch):
    """The page's blocks in order, in one namespace (as a reader pastes them), in an empty working directory.
    The fixture images' regions come from the `easy` store, extracted once by the runs' own detector: the
    detector path of the pipelines is tested in test_inference.py, and re-running it here would cost seconds."""
    images = tmp_path / "photos"
    images.mkdir()
    known = {str(easy.files[k]): easy.store[k] for k in easy.files}
    for k in ("5", "6", "7"):
        (images / f"{k}.png").write_bytes(Path(easy.files[k]).read_bytes())
        known[str(images / f"{k}.png")] = easy.store[k]
    extract = VLProcessor.regions

    def stored_regions(self, images, boxes=None, batch_size=16):
        return extract(
            self, [known.get(str(i), i) if isinstance(i, (str, os.PathLike)) else i for i in images], boxes, batch_size
        )

    monkeypatch.setattr(VLProcessor, "regions", stored_regions)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__doc__"}
    for block_page, source in python_blocks():
        if block_page == page:
            exec(compile(_substituted(source, doc_runs, easy, images), page, "exec"), namespace)


#: The quick start's measured runs (docs/performance.md, "The quick start"): their metrics.json and what
#: tools/predict.py printed about photo.png, as the README's and performance.md's sample outputs show them.
QUICKSTART_RUN = ROOT / "docs" / "quickstart-run"


def _indented(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def test_the_sample_tables_are_the_measured_quick_start_runs_as_the_tools_print_them():
    """The end-of-run tables that README.md and docs/performance.md show are, verbatim, what the training tools
    print (`results_table`) for the recorded metrics of the measured quick-start runs; a changed table, or a run
    measured again without new samples, fails here. The recorded VQA run is the quick start's: scored on every
    test question, ahead of its majority baseline."""
    readme, performance = (ROOT / "README.md").read_text(), (ROOT / "docs" / "performance.md").read_text()
    vqa = json.loads((QUICKSTART_RUN / "vqa-easy-vqa.metrics.json").read_text())
    vl = json.loads((QUICKSTART_RUN / "vl-default.metrics.json").read_text())
    assert _indented(results_table(vqa)) in readme and _indented(results_table(vqa)) in performance
    assert _indented(results_table(vl)) in performance
    assert (
        vqa["eval_questions"] == 9673
        and vqa["step"] == load_run_config("finetune/vqa-easy-vqa")["training"]["max_steps"]
        and vl["step"] == load_run_config("vl/default")["training"]["max_steps"]
    )


def test_the_sample_answer_is_the_measured_runs_in_the_shape_predict_prints(
    doc_runs, easy, tmp_path, monkeypatch, capsys
):
    """The README's answer about photo.png is the recorded one (its JSON line, the image's folder elided, and the
    pipeline comment's rounded scores), and `vlbert example-image photo.png` then the README's predict line print
    it in that shape: one JSON object with the same keys in the same order, three answers, the first the answer
    (here on the tiny doc run, whose regions come from the `easy` store as in test_every_python_block_runs)."""
    readme = (ROOT / "README.md").read_text()
    recorded = json.loads((QUICKSTART_RUN / "predict.jsonl").read_text())
    assert _indented(json.dumps({**recorded, "image": ".../photo.png"})) in readme.splitlines()
    top = recorded["answers"][:2]
    assert (
        f'[{{"answer": "{top[0]["answer"]}", "score": {top[0]["score"]:.3f}}}, {{"answer": "{top[1]["answer"]}", '
        f'"score": {top[1]["score"]:.3f}}}, ...]'
    ) in readme

    monkeypatch.chdir(tmp_path)
    assert command_main("example-image")(["photo.png"]) == 0
    assert "easy-VQA test/0, a red triangle" in capsys.readouterr().out
    photo = str(tmp_path / "photo.png")
    assert Path(photo).read_bytes() == Path(easy.files["0"]).read_bytes()
    extract = VLProcessor.regions
    monkeypatch.setattr(
        VLProcessor,
        "regions",
        lambda self, images, boxes=None, batch_size=16: extract(
            self, [easy.store["0"] if str(i) in ("photo.png", photo) else i for i in images], boxes, batch_size
        ),
    )
    assert (
        tool("predict")(
            [str(doc_runs["vqa-easy-vqa"]), "--image", "photo.png", "--text", recorded["text"], "--top-k", "3"]
        )
        == 0
    )
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(printed) == 1 and list(printed[0]) == list(recorded)
    assert len(printed[0]["answers"]) == 3 and printed[0]["answer"] == printed[0]["answers"][0]["answer"]
    assert list(printed[0]["answers"][0]) == list(recorded["answers"][0]) and printed[0]["image"].endswith("photo.png")
