"""The documentation runs as written (issue 44): every ```python block of README.md and docs/*.md executes (on the
tiny runs of `doc_runs` and the easy-VQA images, with the user's paths substituted: :data:`PATHS`), and every
command line shown (code blocks and inline commands) parses with its tool: the tool's own argparse parser reads
the flags in-process and the tool stops there, and a ``--config`` that names a shipped config must resolve with
the ``--set`` overrides applied. A renamed flag, subcommand or config fails here instead of a reader."""

from __future__ import annotations

import argparse
import os
import re
import shlex
from pathlib import Path

import pytest

from conftest import ROOT, tool
from vlbert.commands import command_main
from vlbert.commands import main as vlbert_main
from vlbert.inference.run import RunInputs
from vlbert.training.run_config import config_dir, load_run_config

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`((?:python |vlbert |torchrun )[^`]*)`")

#: Placeholders the docs use for a user's files -> a fixture (a `doc_runs` run name, or an image of `easy`).
PATHS = {"runs/vqa-easy-vqa": "vqa-easy-vqa", "runs/mine": "vqa-easy-vqa", "runs/vl-default": "vl-default",
         "models/uniter-base": "vl-default", "runs/snli-ve-easy-vqa": "snli-ve-easy-vqa",
         "runs/nlvr2-easy-vqa": "nlvr2-easy-vqa", "runs/refcoco-easy-vqa": "refcoco-easy-vqa",
         "runs/retrieval-easy-vqa": "retrieval-easy-vqa", "runs/bbc-news": "bbc-news",
         "runs/text-default": "text-default",
         "photo.png": "image:0", "photo.jpg": "image:0", "a.png": "image:1", "b.png": "image:2",
         "left.png": "image:3", "right.png": "image:4", "photos/": "images"}


def python_blocks() -> list[tuple[str, str]]:
    """(page, source) of every ```python block."""
    return [(page.relative_to(ROOT).as_posix(), m.group(2)) for page in PAGES
            for m in FENCE.finditer(page.read_text(encoding="utf-8")) if m.group(1) == "python"]


def command_lines() -> list[tuple[str, str]]:
    """(page, command) of every tool command shown: lines of indented and non-python fenced blocks (``\\``
    continuations joined, comments dropped) and inline `python tools/...` / `vlbert ...` code, where it is
    a whole command (no ``|``, ``[...]`` or ``...`` alternatives)."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        blocks = [m.group(2) for m in FENCE.finditer(text) if m.group(1) != "python"]
        prose = FENCE.sub("", text)
        blocks += ["\n".join(line[4:] for line in chunk.splitlines())
                   for chunk in re.findall(r"(?:^    .*\n?)+", prose, re.M)]
        lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
        lines += [m.group(1) for m in INLINE.finditer(prose)  # whole commands, not names of one (`vlbert predict`)
                  if not re.search(r"\\\||\[|\.\.\.|<|tools/X\.py", m.group(1)) and len(m.group(1).split()) > 2]
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
        words = ["python", *words[scripts[0]:]]
    if words[:1] == ["python"] and len(words) > 1 and words[1].startswith("tools/"):
        return "tools", words[1][len("tools/"):-len(".py")], words[2:]
    if words[:1] == ["vlbert"] and len(words) > 1:
        return ("vlbert", words[1], words[2:]) if not words[1].startswith("-") else ("vlbert", "", words[1:])
    if words[:3] == ["python", "-m", "vlbert"] and len(words) > 3:
        return "vlbert", words[3], words[4:]
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

    def parse(command: str):
        kind, name, argv = _tool_words(shlex.split(command))
        main = tool(name) if kind == "tools" else command_main(name) if name else vlbert_main
        argv = [w for w in argv if not w.startswith("...")]  # "...": the rest of a command said elsewhere
        if main is vlbert_main:  # `vlbert --help`: the command's own usage, no parser
            assert main(argv) == 0
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
    if Path(config).is_file() or (config_dir() / f"{shipped}.yaml").is_file() or "/" in config and \
            config.split("/")[0] in ("configs", "text", "vl", "finetune", "detectors"):
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
    extract = RunInputs.regions

    def stored_regions(self, images, boxes=None, batch_size=16):
        return extract(self, [known.get(str(i), i) if isinstance(i, (str, os.PathLike)) else i for i in images],
                       boxes, batch_size)

    monkeypatch.setattr(RunInputs, "regions", stored_regions)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__doc__"}
    for block_page, source in python_blocks():
        if block_page == page:
            exec(compile(_substituted(source, doc_runs, easy, images), page, "exec"), namespace)
