"""Users' JSON, JSONL and YAML files read through one door: run configs, label maps, published configs,
saved processors (``processor.json``), the benchmarks' question and annotation files, caption sources.

A file that cannot be read as what it should be (cut off, hand-edited, another format, not UTF-8) raises
:class:`UserFileError`, a ``ValueError`` whose one-line message names the file, the line and column where the
parser gives them, what the file should be, and the fix; the tools print it as ``error: ...`` (see
:mod:`vlbert.commands`). A mapping that gives a key twice is refused, in JSON as in YAML. A missing file raises
``FileNotFoundError`` naming what it should have been, and a directory given for a file ``IsADirectoryError``. The parsers are the standard library's :mod:`json` and PyYAML's
``safe_load`` (plain data only, never code).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import yaml

_DEFAULT_FIX = "fix the file there, or write it again"


class UserFileError(ValueError):
    """A user's file that does not parse, or holds values of the wrong type; the message says where and the fix."""


def _text(path: Path, what: str) -> str:
    if path.is_dir():
        raise IsADirectoryError(f"{what} {path} is a directory; give the file itself")
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserFileError(f"{path}: not UTF-8 text (byte {e.start}); is it the {what}?") from None


def _cut_off(text: str, position: int) -> str:
    return (
        " (the file ends there: it may be cut off, e.g. by an interrupted copy)"
        if position >= len(text.rstrip())
        else ""
    )


class _DuplicateKey(Exception):
    def __init__(self, key: str, keys: list[str]):
        super().__init__(key)
        self.key, self.keys = key, keys


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's mapping, refusing a key given twice (``json`` keeps the last one silently)."""
    mapping = dict(pairs)
    if len(mapping) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key, list(mapping))
            seen.add(key)
    return mapping


def parse_json(text: str, source: str, what: str = "JSON file", fix: str = _DEFAULT_FIX) -> Any:
    """``text`` parsed as JSON; ``source`` names it in errors (a path, ``path:line`` for a JSON line). An object
    that gives a key twice is refused (the standard parser keeps the last one silently: a ``labels`` given twice, or
    an annotation's ``answers``); the check runs in each object's construction (about a fifth more parsing time).

    Raises:
        UserFileError: not valid JSON: ``source:line:column: not valid JSON for the <what> (<problem>); <fix>``; a
            key given twice: ``source: not valid JSON for the <what> (key 'k' is given twice in one object, the
            object of keys 'a', 'k', ...: the parser would keep the last silently); <fix>``.
    """
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        where = f"{source}:{e.lineno}:{e.colno}" if ":" not in source else f"{source}, column {e.colno}"
        raise UserFileError(f"{where}: not valid JSON for the {what} ({e.msg}{_cut_off(text, e.pos)}); {fix}") from None
    except _DuplicateKey as e:
        keys = ", ".join(repr(k) for k in e.keys[:4]) + (", ..." if len(e.keys) > 4 else "")
        raise UserFileError(
            f"{source}: not valid JSON for the {what} (key {e.key!r} is given twice in one object, the object of keys "
            f"{keys}: the parser would keep the last silently); {fix}"
        ) from None


def read_json(path: str | os.PathLike, what: str = "JSON file", fix: str = _DEFAULT_FIX) -> Any:
    """The JSON value in the file ``path`` (``what`` names the file's role in messages, e.g. "label map").

    Raises:
        FileNotFoundError: no such file. IsADirectoryError: a directory. UserFileError: not UTF-8 or not valid
            JSON (file, line and column named).
    """
    path = Path(path).expanduser()
    return parse_json(_text(path, what), str(path), what, fix)


def read_jsonl(
    path: str | os.PathLike, what: str = "JSON lines file", fix: str = _DEFAULT_FIX
) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` for each non-blank line of a JSON lines file, ``where`` = ``"path:line"``.

    Raises:
        FileNotFoundError, IsADirectoryError, UserFileError: as :func:`read_json`, the bad line named.
    """
    path = Path(path).expanduser()
    text = _text(path, what)
    for line_no, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield f"{path}:{line_no}", parse_json(line, f"{path}:{line_no}", what, fix)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives a key twice (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)  # merge keys (<<) first: a key a merge brings in may be given again
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:
                    continue  # an unhashable key: PyYAML's own error follows
                if first is not key_node.start_mark:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice (first at line {first.line + 1})", key_node.start_mark
                    )
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | os.PathLike, what: str = "YAML file", fix: str = _DEFAULT_FIX) -> Any:
    """The YAML value in the file ``path`` (``yaml.safe_load``'s rules: plain data only; JSON is YAML too), a
    mapping that gives a key twice refused (a section given twice would keep the last one silently).

    Raises:
        FileNotFoundError, IsADirectoryError: as :func:`read_json`. UserFileError: not UTF-8 or not valid YAML
            (``path:line:column``, the parser's problem and where its context started), or a key given twice in
            one mapping (``path:line:column: ... (key 'training' is given twice (first at line 3)); <fix>``).
    """
    path = Path(path).expanduser()
    text = _text(path, what)
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = e.problem or "syntax error"
        if e.context and e.context_mark is not None:
            problem = (
                f"{e.context} started at line {e.context_mark.line + 1}, column {e.context_mark.column + 1}: {problem}"
            )
        raise UserFileError(f"{where}: not valid YAML for the {what} ({problem}); {fix}") from None
    except yaml.YAMLError as e:
        raise UserFileError(f"{path}: not valid YAML for the {what} ({e}); {fix}") from None


def expect(value: Any, kind: type | tuple[type, ...], where: str, description: str, fix: str = _DEFAULT_FIX) -> Any:
    """``value`` if it is a ``kind`` (``bool`` is not taken for ``int``), else :class:`UserFileError`:
    ``<where>: <description> must be <kind>, got <type> <value>; <fix>``."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds):
        return value
    names = " or ".join(
        {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number"}.get(k, k.__name__)
        for k in kinds
    )
    raise UserFileError(f"{where}: {description} must be {names}, got {type(value).__name__} {repr(value)[:60]}; {fix}")


__all__ = ["UserFileError", "parse_json", "read_json", "read_jsonl", "read_yaml", "expect"]
