"""The import graph follows the layers (docs/architecture.md "Layout"): no cycle between vlbert's subpackages, detectors and
vlbert.common; vlbert.detectors (the folder detectors/) imports only vlbert.common, which imports nothing of vlbert; no function-level import of the project's own modules
(a hidden cycle) except the lazily built optional detector backends; the benchmarks (the folder benchmarks/, outside
the wheel) import vlbert, and neither vlbert nor detectors imports them. Read from the source with ``ast``, so the
test sees imports that a run would only reach on some path."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("vlbert", "detectors")  # the folders; detectors/ installs as vlbert.detectors (setup.py)


def _module_path(dotted: str) -> Path:
    """The file or folder of a dotted module name of the project (vlbert.detectors.* lives in detectors/)."""
    parts = dotted.split(".")
    if parts[:2] == ["vlbert", "detectors"]:
        parts = ["detectors", *parts[2:]]
    return ROOT / Path(*parts)


def _module_name(rel: str) -> str:
    """The dotted module name of a file of the project, relative to the repository (detectors/x.py: vlbert.detectors.x)."""
    name = ".".join(Path(rel).with_suffix("").parts).removesuffix(".__init__")
    return "vlbert." + name if name.split(".")[0] == "detectors" else name


# detectron2_detector's own helpers (vlbert.detectors.detectron2_butd) need detectron2 installed, which is optional: they are imported
# when a detectron2 backend is built. Every other backend module is imported with the table (detectors/backends.py).
LAZY_ALLOWED = {"detectors/detectron2_detector.py"}


def _node(module: str) -> str:
    """The graph node of a dotted module name: vlbert's subpackage or top-level module, or the package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "vlbert" and len(parts) > 1 else parts[0]


def _imports(packages: tuple[str, ...] = PACKAGES, imported: str = "vlbert") -> list[tuple[str, str, int, bool]]:
    """(file, imported module, line, at function level) for every import of the package ``imported`` (vlbert's own
    modules, by default) in the files of ``packages``."""
    found = []
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"))
            type_only = {
                id(n)
                for block in ast.walk(tree)
                if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                for n in ast.walk(block)
            }
            for node in ast.walk(tree):
                if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in type_only:
                    continue
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    base = node.module or ""
                    names = [
                        f"{base}.{a.name}"
                        if _module_path(f"{base}.{a.name}").with_suffix(".py").exists()
                        or _module_path(f"{base}.{a.name}").is_dir()
                        else base
                        for a in node.names
                    ]
                for name in names:
                    if name.split(".")[0] == imported:
                        found.append((rel, name, node.lineno, node.col_offset > 0))
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for rel, name, _, _ in _imports():
        source = _node(_module_name(rel))
        target = _node(name)
        if target != source:
            graph.setdefault(source, set()).add(target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_packages():
    graph = _graph()
    assert "vlbert.models" in graph and "vlbert.objectives" in graph["vlbert.models"]  # the graph was read
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"


def test_lower_layers_do_not_import_vlbert():
    graph = _graph()
    assert graph.get("vlbert.common", set()) == set()
    assert graph.get("vlbert.detectors", set()) <= {"vlbert.common"}
    assert "vlbert.models" not in graph.get("vlbert.objectives", set())
    assert not {"vlbert.recipes", "vlbert.commands"} & graph.get("vlbert.training", set())


def test_the_library_never_imports_the_benchmarks():
    """benchmarks/ is not in the wheel (setup.py): vlbert and detectors never import it, by an import statement
    (read with ``ast``, every path) or by its name at run time (importlib), so an installed vlbert never misses it;
    ``vlbert benchmark`` starts ``python -m benchmarks`` in a child process instead. The benchmarks import vlbert."""
    assert _imports(imported="benchmarks") == []
    by_name = [
        f"{path.relative_to(ROOT)}: {m.group(0)}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for m in re.finditer(r"(import_module|__import__|find_spec)\(\s*[\"']benchmarks", path.read_text("utf-8"))
    ]
    assert by_name == []
    assert {name.split(".")[1] for _, name, _, _ in _imports(("benchmarks",)) if "." in name} >= {"models", "data"}


def test_inference_stands_on_its_own():
    """``import vlbert.inference`` in a fresh interpreter loads neither the trainer nor the recipes (nor analysis,
    which calls inference's core, not the reverse), nor torch._dynamo (2 s of every command's start: torchvision.ops
    imports it, and torch.compiler.disable does) or torchvision, which wait for a run that compiles or a backbone."""
    probe = (
        "import sys, vlbert.inference; print(sorted({m.split('.')[1] for m in sys.modules "
        "if m.startswith('vlbert.') and m.split('.')[1] in ('training', 'recipes', 'analysis', 'commands')} | "
        "{m for m in ('torch._dynamo', 'torchvision') if m in sys.modules}))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", f"import vlbert.inference loads {loaded}"


def test_no_function_level_import_of_the_project():
    hidden = [
        f"{rel}:{line} imports {name}" for rel, name, line, nested in _imports() if nested and rel not in LAZY_ALLOWED
    ]
    assert hidden == []


def test_cycle_finder_sees_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


#: The house rule's bound: the public definitions one module may hold (test_a_module_holds_one_idea).
MAX_PUBLIC_DEFINITIONS = 15


def _source_files() -> list[Path]:
    """The modules the house rules cover: vlbert, detectors, tools and benchmarks (not the tests)."""
    return sorted(
        [
            *ROOT.joinpath("vlbert").rglob("*.py"),
            *ROOT.joinpath("detectors").rglob("*.py"),
            *ROOT.joinpath("tools").glob("*.py"),
            *ROOT.joinpath("benchmarks").rglob("*.py"),
        ]
    )


def _public_definitions(tree: ast.Module) -> list[str]:
    """The module's top-level classes and functions whose names do not start with an underscore."""
    kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [node.name for node in tree.body if isinstance(node, kinds) and not node.name.startswith("_")]


def test_a_module_holds_one_idea():
    """The house rule counts ideas, not lines: a module defines at most MAX_PUBLIC_DEFINITIONS (15) public classes
    and functions at its top level (vlbert, detectors, tools, benchmarks). A public definition is a name offered to
    other modules, one thing a reader of the module has to learn; past 15 a module holds more than one idea and is
    split. Chosen from the distribution when the rule was set (211 modules: median 3, 90% at most 8, 95% at most
    10; the largest, commands/explain.py and recipes/regions.py, at 15). Private helpers (``_name``) do not count:
    they serve the public ones. Lines do not either: docstrings, tables and the formatter's layout make length a
    poor measure of what a module asks of its reader. A function's size is ruff's McCabe bound (C901,
    max-complexity in pyproject.toml)."""
    counts = {
        str(path.relative_to(ROOT)): len(_public_definitions(ast.parse(path.read_text(encoding="utf-8"))))
        for path in _source_files()
    }
    over = {path: n for path, n in counts.items() if n > MAX_PUBLIC_DEFINITIONS}
    largest = sorted(counts.items(), key=lambda item: -item[1])[:5]
    assert over == {}, f"modules over {MAX_PUBLIC_DEFINITIONS} public definitions: {over} (largest: {largest})"


def _defined_names(tree: ast.Module) -> set[str]:
    """The names a module defines at its top level (classes, functions, assignments, also under ``if``/``try``);
    not the names it imports."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _all_names(tree: ast.Module) -> list[str] | None:
    """The module's literal ``__all__``, or None where it has none."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return None


def test_all_names_the_modules_own_api():
    """``__all__`` names the real API: a module's lists only names the module itself defines (no ``_private``
    helper, no name imported from another module: each name is exported once, by the module that defines it). A
    package's ``__init__`` is its facade: it gathers its modules' names, and only ``_private`` ones are refused
    there. A name a module imports for others to import from it is not its API; where one is kept for an importer
    it says so (``import x as x``)."""
    wrong = []
    for path in _source_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = _all_names(tree)
        if names is None:
            continue
        defined = _defined_names(tree)
        for name in names:
            private = name.startswith("_") and not name.startswith("__")
            if private or (path.name != "__init__.py" and name not in defined):
                wrong.append(f"{path.relative_to(ROOT)}: {name}")
    assert wrong == [], "\n".join(wrong)


def test_a_checkout_imports_without_installing(tmp_path):
    """The repository's root on PYTHONPATH, nothing installed (a machine without a package index, such as the GPU
    machine): ``vlbert.detectors`` is the folder detectors/ beside the package, as setup.py installs it."""
    code = (
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
        "sys.modules.pop('vlbert', None); sys.path.insert(0, sys.argv[1])\n"
        "import vlbert.detectors.regions as r; print(r.__file__)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(ROOT / "detectors" / "regions.py")
