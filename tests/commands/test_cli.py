"""The ``vlbert`` console command (issue 44): its subcommands are the tools, the old script paths still run the
same code, the three task tools are ``finetune --task`` with their default configs, the benchmarks are one tool,
configs resolve by name from the package, and an installed wheel runs outside the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from helpers.builders import ROOT, tool

from vlbert.commands import COMMANDS, command_main, main, run_tool
from vlbert.commands.scripts import SCRIPTS
from vlbert.training.run_config import config_dir, config_names, load_run_config, resolve_config_path


def test_help_lists_every_subcommand(capsys):
    assert main(["--help"]) == 0
    shown = capsys.readouterr().out
    for name in ("pretrain", "finetune", "predict", "extract", "convert", "explain", "benchmark", "demo"):
        assert f"\n  {name} " in shown
    assert main(["pretrian"]) == 2 and "unknown command 'pretrian'" in capsys.readouterr().err


def test_every_subcommand_and_script_has_a_parser(capsys):
    """Each subcommand prints its own help; each tools/*.py script runs the same main as its subcommand. (``vlbert
    benchmark --help`` is the benchmarks' own, printed by a child process, and the benchmark scripts run the
    benchmarks package: tests/benchmarks.)"""
    for name in COMMANDS:
        if name == "benchmark":
            continue
        try:
            status = command_main(name)(["--help"])
        except SystemExit as done:  # argparse's --help
            status = done.code
        assert status == 0 and capsys.readouterr().out.startswith("usage: "), name
    for script in ROOT.joinpath("tools").glob("*.py"):  # every other script is a command line of vlbert.commands
        if script.stem.startswith("benchmark"):
            assert script.stem not in SCRIPTS
            continue
        assert SCRIPTS[script.stem][0] in COMMANDS, script
        assert "run_script(__file__)" in script.read_text(), f"{script} is not a thin script over vlbert.commands"
    assert SCRIPTS["finetune_vqa"] == ("finetune", "--task", "vqa") and SCRIPTS["pretrain"] == ("pretrain",)
    capsys.readouterr()


def test_a_script_in_tools_runs_its_command_as_a_process(monkeypatch, capsys):
    """The shim itself: ``python tools/finetune_vqa.py`` is ``vlbert finetune --task vqa`` (a text flag refused
    under the error rule: one line naming the task, status 2); ``python -m vlbert`` (its ``__main__`` run as
    ``-m`` runs it, in this process) is the same command line. (Each process costs an interpreter start and the
    imports, about 8 s of CPU: the scripts' parsers are checked in-process by test_docs.)"""
    import runpy

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    refused = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "finetune_vqa.py"), "--type", "qa"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert refused.returncode == 2 and refused.stdout == ""
    assert (
        refused.stderr.strip() == "error: --type is a flag of text tasks, not of vqa; leave it out or pass --task text"
    )
    monkeypatch.setattr(sys, "argv", ["vlbert", "--help"])
    with pytest.raises(SystemExit) as listed:
        runpy.run_module("vlbert", run_name="__main__")
    assert listed.value.code == 0 and "\n  finetune " in capsys.readouterr().out


def _checkout(root: Path, main: str | None) -> Path:
    """A stand-in checkout at ``root``: pyproject.toml, vlbert/ and, with ``main``, benchmarks/__main__.py."""
    (root / "vlbert").mkdir(parents=True)
    (root / "pyproject.toml").write_text("")
    if main is not None:
        (root / "benchmarks").mkdir()
        (root / "benchmarks" / "__init__.py").write_text("")
        (root / "benchmarks" / "__main__.py").write_text(main)
    return root


def test_vlbert_benchmark_runs_the_checkouts_benchmarks_in_a_child_process(tmp_path, monkeypatch, capfd):
    """In a checkout, ``vlbert benchmark ARGS`` is ``python -m benchmarks ARGS`` run with this Python, the checkout's
    root first on the child's PYTHONPATH (its benchmarks, not another on the path), from the user's directory; the
    child's exit status is the command's. (A stand-in checkout whose benchmarks print where they run.)"""
    from vlbert.commands.benchmark import CHECKOUT, benchmarks_folder
    from vlbert.commands.benchmark import main as launch

    assert CHECKOUT == ROOT and benchmarks_folder() == ROOT / "benchmarks"
    fake = _checkout(
        tmp_path / "clone",
        "import os, sys, benchmarks\nprint(sys.argv[1:], benchmarks.__file__, os.getcwd())\nsys.exit(3)\n",
    )
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the real benchmarks on the path too: the checkout's come first
    monkeypatch.chdir(tmp_path)
    assert launch(["train", "--device", "cuda", "--json"], root=fake) == 3
    argv, where, cwd = capfd.readouterr().out.rsplit(" ", 2)
    assert argv == "['train', '--device', 'cuda', '--json']"
    assert where == str(fake / "benchmarks" / "__init__.py") and cwd.strip() == str(tmp_path)


def test_without_a_checkout_vlbert_benchmark_says_where_the_benchmarks_are(tmp_path, capsys):
    """An installed wheel (no benchmarks/ beside the package; a ``benchmarks`` package of another distribution in
    site-packages is not a checkout's): one line saying where the benchmarks live and how to run them, status 2."""
    from vlbert.commands.benchmark import benchmarks_folder
    from vlbert.commands.benchmark import main as launch

    site = tmp_path / "site-packages"
    (site / "vlbert").mkdir(parents=True)
    (site / "benchmarks").mkdir()
    (site / "benchmarks" / "__main__.py").write_text("raise SystemExit(0)\n")
    assert benchmarks_folder(site) is None
    assert run_tool(lambda argv: launch(argv, root=site), ["train"]) == 2
    line = capsys.readouterr().err
    assert len(line.splitlines()) == 1
    assert line.startswith("error: the benchmarks are not part of the installed vlbert package: they live in the ")
    assert "repository's benchmarks/ folder; in a clone of it, run python -m benchmarks <name> [flags]" in line


@pytest.mark.integration
def test_vlbert_benchmark_in_this_checkout_is_python_m_benchmarks(tmp_path):
    """The GPU check's spelling, ``python -m vlbert benchmark ...``, from another directory: this checkout's
    benchmark runs, and its refusal (one ``error:`` line, status 2) comes back unchanged. The command itself imports
    no benchmark (tests/layers/test_layers.py)."""
    done = subprocess.run(
        [sys.executable, "-m", "vlbert", "benchmark", "extraction", "--weights", "w.pth"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.startswith("error: --weights is one backend's file") and len(done.stderr.splitlines()) == 1


def test_text_fine_tuning_is_finetune_task_text(monkeypatch):
    """--task names a task everywhere and --dataset the task's data reader; tools/finetune_text.py is finetune
    --task text. A text dataset given as --task is no task: argparse's usage error."""
    import vlbert.commands.finetune as finetune

    seen = {}
    monkeypatch.setattr(
        finetune,
        "run_from_args",
        lambda args, task, extra=(): seen.update(task=task, config=str(args.config), extra=dict(extra)),
    )
    glue = ["--dataset", "glue", "--glue-task", "mrpc", "--type", "classification"]
    for argv, runs in (
        (["--task", "text", *glue], command_main("finetune")),
        (glue, tool("finetune_text")),
    ):
        seen.clear()
        assert runs(argv) == 0
        assert seen["task"] == "text" and seen["config"] == "finetune/bbc-news", argv
        assert {k: v for k, v in seen["extra"].items() if v is not None} == {
            "data.dataset": "glue",
            "data.glue_task": "mrpc",
            "data.type": "classification",
        }, argv
    with pytest.raises(ValueError, match="--train is a flag of text tasks, not of vqa"):
        command_main("finetune")(["--task", "vqa", "--train", "train.csv"])
    for not_a_task in ("bbc", "glue"):  # argparse's usage error
        with pytest.raises(SystemExit):
            command_main("finetune")(["--task", not_a_task])
    assert "finetune-text" not in COMMANDS


def test_task_tools_are_finetune_with_their_task_and_config(monkeypatch):
    """finetune_vqa.py = finetune --task vqa with finetune/vqa-easy-vqa; finetune --task nlvr2 without --config
    takes nlvr2's default; flags reach the config as before."""
    import vlbert.commands.finetune as finetune

    seen = {}
    monkeypatch.setattr(
        finetune,
        "run_from_args",
        lambda args, task, extra=(): seen.update(task=task, config=str(args.config), extra=dict(extra)),
    )
    assert tool("finetune_vqa")(["--dataset", "vqa-v2", "--max-steps", "3"]) == 0
    assert seen == {"task": "vqa", "config": "finetune/vqa-easy-vqa", "extra": {"data.dataset": "vqa-v2"}}
    assert command_main("finetune")(["--task", "nlvr2"]) == 0 and seen["config"] == "finetune/nlvr2-easy-vqa"
    assert tool("finetune_retrieval")([]) == 0 and seen["task"] == "retrieval"
    config = str(ROOT / "configs" / "finetune" / "snli-ve-easy-vqa.yaml")
    assert command_main("finetune")(["--config", config]) == 0 and seen["task"] == "snli-ve"


def test_configs_resolve_by_name_from_the_package(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no configs/ here: names and repository paths resolve from the package
    assert resolve_config_path("vl/uniter-base") == config_dir() / "vl" / "uniter-base.yaml"
    assert resolve_config_path("configs/text/default.yaml") == config_dir() / "text" / "default.yaml"
    with_base = load_run_config("finetune/uniter-base-vqa-v2")  # its _base_ resolves beside it
    assert with_base["task"] == "vqa" and with_base["init_from"] == "models/uniter-base"
    own = tmp_path / "vl" / "uniter-base.yaml"  # a file of the user's wins over a shipped name
    own.parent.mkdir()
    own.write_text("modality: vl\n")
    assert load_run_config("vl/uniter-base.yaml") == {"modality": "vl"}
    assert {"text/default", "vl/default", "finetune/vqa-easy-vqa", "detectors/easy-vqa"} <= set(config_names())
    assert run_tool(command_main("pretrain"), ["--config", "vl/no-such"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: config file vl/no-such does not exist and is not the name of a shipped config")
    assert len(err.splitlines()) == 1 and "vlbert configs" in err
    assert command_main("configs")([]) == 0 and "vl/uniter-base\n" in capsys.readouterr().out


def test_a_checkout_is_told_to_install_its_extras_in_place():
    """This checkout (an editable install) is told ``pip install -e '.[extra]'`` in its own directory; a wheel is
    told ``pip install 'vlbert[extra]'`` (the wheel test below). It had said the wheel's advice in a checkout since
    the module moved to vlbert/common."""
    from vlbert.common.dependencies import extra_install

    assert extra_install("demo", "easy-vqa") == f"pip install -e '.[demo]' in {ROOT}  (or pip install easy-vqa)"


@pytest.mark.slow
@pytest.mark.integration
def test_the_wheel_runs_outside_the_checkout(tmp_path):
    """Build the wheel, install it into a fresh virtual environment that reuses the installed dependencies (a
    .pth line naming this interpreter's site-packages), and run ``vlbert pretrain --modality text --max-steps 2``
    from an empty directory, without PYTHONPATH: the code, the configs and the defaults come from the wheel. The
    repository's benchmarks/ and tools/ stay out of it, and its ``vlbert benchmark`` says where they are."""
    source = tmp_path / "src"
    for name in ("vlbert", "detectors", "configs", "benchmarks", "tools"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", source], check=True)
    wheel = next((tmp_path / "dist").glob("vlbert-*.whl"))
    top = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert top == {"vlbert", wheel.name.split("-py")[0] + ".dist-info"}, top  # no benchmarks/, no tools/
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dependencies = [p for p in sys.path if p.endswith("site-packages")]
    Path(site, "installed-dependencies.pth").write_text("\n".join(dependencies) + "\n")
    subprocess.run(
        [*pip, "--python", python, "install", "--no-deps", "--no-index", "--ignore-installed", wheel], check=True
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [
            env_dir / "bin" / "vlbert",
            "pretrain",
            "--modality",
            "text",
            "--max-steps",
            "2",
            "--set",
            "training.batch_size=4",
            "--set",
            "data.max_eval_batches=1",
            "--set",
            "training.progress_bar=false",
        ],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # Which vlbert the venv imports, and the install advice its dependencies module gives (that module executed on
    # its own: importing the package would start torch in a third interpreter, for one string).
    probe = (
        "import importlib.util as u, pathlib\n"
        "origin = u.find_spec('vlbert').origin\n"
        "spec = u.spec_from_file_location('d', pathlib.Path(origin).parent / 'common' / 'dependencies.py')\n"
        "d = u.module_from_spec(spec)\n"
        "spec.loader.exec_module(d)\n"
        "print(origin)\n"
        "print(d.extra_install('demo', 'easy-vqa'))\n"
    )
    where, advice = subprocess.run(
        [python, "-c", probe], cwd=empty, env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert where.startswith(str(env_dir))  # the wheel's code ran, not the checkout's
    assert advice.startswith("pip install 'vlbert[demo]'")  # a wheel is not told to `pip install -e .`
    assert (empty / "runs" / "text-default" / "model.safetensors").is_file() and "final metrics" in done.stdout
    # the end-of-run table (NSP beside its chance level) and the held-out evaluation printed as it happens
    nsp = [line for line in done.stdout.splitlines() if line.startswith("eval_nsp_accuracy ")]
    assert len(nsp) == 1 and "0.5000 chance" in nsp[0], done.stdout
    assert "held-out at step 2: mlm_accuracy" in done.stderr
    told = subprocess.run(
        [env_dir / "bin" / "vlbert", "benchmark", "train"], cwd=empty, env=env, capture_output=True, text=True
    )
    assert told.returncode == 2 and len(told.stderr.splitlines()) == 1, told.stderr
    assert "they live in the repository's benchmarks/ folder" in told.stderr


def test_demo_refusals_are_one_line(doc_runs, monkeypatch, capsys):
    """A run whose task the page does not show, and a missing gradio: one line each, status 2."""
    assert run_tool(command_main("demo"), [str(doc_runs["nlvr2-easy-vqa"])]) == 2
    assert "is a 'nlvr2' run; the demo shows runs of retrieval, vl-pretraining, vqa" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "gradio", None)  # as if not installed
    assert run_tool(command_main("demo"), [str(doc_runs["vqa-easy-vqa"])]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: vlbert demo needs gradio: pip install 'vlbert[demo-web]' (or pip install gradio)"
    )


def test_example_image_writes_a_test_picture_with_its_answers_and_never_overwrites(tmp_path, capsys):
    """`vlbert example-image` copies an easy-VQA test image of the asked colour and shape and prints the dataset's
    own questions about it; an existing file is refused in one line and kept."""
    from vlbert.commands import run_tool
    from vlbert.data.easy_vqa import color_and_shape, image_paths

    out = tmp_path / "photo.png"
    assert main(["example-image", str(out), "--color", "red", "--shape", "circle"]) == 0
    printed = capsys.readouterr().out.splitlines()
    image_id = printed[0].split("easy-VQA ")[1].split(",")[0]
    assert color_and_shape("test")[image_id] == ("red", "circle")
    assert out.read_bytes() == image_paths("test")[image_id].read_bytes()
    assert any(line.strip().endswith("->  circle") for line in printed[1:])
    assert run_tool(command_main("example-image"), [str(out), "--id", "test/1"]) == 2
    assert "exists" in capsys.readouterr().err and out.read_bytes() == image_paths("test")[image_id].read_bytes()
