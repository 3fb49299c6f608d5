"""Run configuration files: YAML with sections ``model``, ``data``, ``training`` (and a few top-level keys),
plus ``--set section.key=value`` overrides from the command line."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

from vlbert_base.user_files import read_yaml


def load_run_config(path: str | os.PathLike | None, overrides: list[str] | None = None,
                    values: list[tuple[str, Any]] | tuple = ()) -> dict[str, Any]:
    """Read a YAML run config, set the typed ``values`` (a tool's flags: ``("training.output_dir", "runs/a #b")``,
    taken as they are) and then apply the ``key.sub=value`` overrides of ``--set`` (values parsed as YAML scalars).

    A config may include others with ``_base_: path`` (or a list of paths), relative to its own file, as
    detectron2 / mmengine configs do: the bases are merged in order (sections merged key by key) and the file's own
    entries win; bases may include bases (a cycle is refused).

    Raises:
        FileNotFoundError: the config file does not exist.
        ValueError: the file is not valid YAML (the message names the file, line and column, as
            ``path:line:column: problem``), not a YAML mapping, an override is not ``key=value``, or ``_base_``
            includes form a cycle.
    """
    config = _load_with_bases(Path(path), ()) if path is not None else {}
    config = copy.deepcopy(config)
    for key, value in values:
        _set_path(config, key, value)
    for item in overrides or []:
        set_dotted(config, item)
    return config


def _set_path(config: dict[str, Any], key: str, value: Any) -> None:
    parts = key.strip().split(".")
    node = config
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"cannot set {key}: {part} is not a section")
    node[parts[-1]] = value


def _load_with_bases(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    """``path``'s mapping over its ``_base_`` includes (resolved relative to ``path``)."""
    where = f" (included by {seen[-1]})" if seen else ""
    if path.is_dir():
        raise IsADirectoryError(f"config {path}{where} is a directory; name a YAML file in it, e.g. "
                                f"{path / 'default.yaml'}")
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist{where}; see configs/ for runnable examples")
    if path.resolve() in seen:
        raise ValueError(f"{path}: _base_ includes form a cycle ({' -> '.join(map(str, seen))} -> {path})")
    loaded = read_yaml(path, "run config", "fix the syntax there (see configs/ for examples)")
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} must hold a YAML mapping (sections model/data/training), got {type(loaded).__name__}")
    bases = loaded.pop("_base_", [])
    bases = [bases] if isinstance(bases, str) else bases
    if not isinstance(bases, list) or not all(isinstance(b, str) and b for b in bases):
        raise ValueError(f"{path}: _base_ must be a config file's path relative to this file, or a list of them, "
                         f"got {bases!r}; write the path (e.g. _base_: ../bases/vl.yaml) or delete the _base_ line")
    merged: dict[str, Any] = {}
    for base in bases:
        _merge(merged, _load_with_bases(path.parent / base, (*seen, path.resolve())))
    _merge(merged, loaded)
    return merged


def _merge(into: dict[str, Any], other: dict[str, Any]) -> None:
    """Merge ``other`` into ``into`` in place: mappings key by key (recursively), anything else replaced."""
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def set_dotted(config: dict[str, Any], assignment: str) -> None:
    """Apply one ``a.b.c=value`` assignment in place; the value is parsed as YAML (``1e-4``, ``true``, ``[1, 2]``).

    Raises:
        ValueError: no ``=``, or an intermediate key holds a non-mapping value.
    """
    if "=" not in assignment:
        raise ValueError(f"--set expects key=value (e.g. training.max_steps=100), got {assignment!r}")
    key, raw = assignment.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        raise ValueError(f"--set {assignment}: the value is not valid YAML; quote it, e.g. {key}='\"...\"'") from None
    if isinstance(value, str):  # YAML 1.1 reads 5e-4 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    _set_path(config, key, value)


def check_sections(config: dict[str, Any], allowed: tuple[str, ...]) -> None:
    """Raise ``ValueError`` for a top-level key that no part of the run reads (usually a typo)."""
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ValueError(f"unknown run config key(s) {unknown}; valid top-level keys are {list(allowed)}")


def dataclass_from_section(cls, values: dict[str, Any] | None, section: str):
    """Build the dataclass ``cls`` from a config section: unknown keys and values of the wrong type are errors
    naming the key; numbers written as strings (YAML 1.1 reads ``1e-4`` as one) are converted.

    Raises:
        ValueError: unknown key, or a value that is not of (or convertible to) the field's type.
    """
    import dataclasses

    values = dict(values or {})
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(types))
    if unknown:
        raise ValueError(f"unknown {section} config key(s) {unknown}; valid keys are {sorted(types)}")
    for key, value in values.items():
        kind = types[key] if isinstance(types[key], str) else getattr(types[key], "__name__", str(types[key]))
        try:
            if kind == "float" and isinstance(value, (int, float, str)) and not isinstance(value, bool):
                values[key] = float(value)
            elif kind == "int":
                if isinstance(value, bool) or float(value) != int(float(value)):
                    raise TypeError  # 1.5 is no count of steps
                values[key] = int(float(value))
            elif kind == "bool" and not isinstance(value, bool):
                raise TypeError
            elif kind == "str" and isinstance(value, bool):
                # YAML 1.1 reads an unquoted no/off (yes/on) as a boolean: training.mixed_precision=no means "no"
                values[key] = "yes" if value else "no"
            elif kind == "str" and not isinstance(value, str):
                values[key] = str(value)
        except (TypeError, ValueError):
            raise ValueError(f"{section}.{key} must be {'an' if kind == 'int' else 'a'} {kind}, got {value!r}") from None
    return cls(**values)


__all__ = ["load_run_config", "set_dotted", "check_sections", "dataclass_from_section"]
