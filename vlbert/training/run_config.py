"""Run configuration files: YAML with sections ``model``, ``data``, ``training`` (and a few top-level keys),
plus ``--set section.key=value`` overrides from the command line."""

from __future__ import annotations

import contextlib
import copy
import os
from pathlib import Path
from typing import Any

import yaml

from vlbert.common.typed_config import from_section
from vlbert.common.user_files import read_yaml

_PACKAGE = Path(__file__).resolve().parents[1]


def config_dir() -> Path:
    """The directory of the shipped run configs (``text/``, ``vl/``, ``finetune/``, ``detectors/``): inside the
    installed package (a wheel ships the repository's ``configs/`` as ``vlbert/configs/``), else the checkout's
    ``configs/`` beside the package (a source tree or an editable install)."""
    installed = _PACKAGE / "configs"
    return installed if installed.is_dir() else _PACKAGE.parent / "configs"


def config_names() -> list[str]:
    """The names of the shipped configs, e.g. ``["finetune/bbc-news", ..., "vl/uniter-base", ...]`` (bases and
    detector sections included)."""
    root = config_dir()
    return sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.rglob("*.yaml"))


def resolve_config_path(
    config: str | os.PathLike,
    relative_to: str | os.PathLike | None = None,
    included_by: str | os.PathLike | None = None,
) -> Path:
    """The file a config name names, by one rule for ``--config`` and ``_base_`` (docs/configuration.md, "Configs
    by name"):

    1. the local file: the name as written, else with ``.yaml`` added, relative to the working directory for
       ``--config`` and to the including file's directory (``relative_to``) for ``_base_`` (an absolute path as
       it is); a directory of that name is returned too (the loader refuses it, saying what to name);
    2. else the shipped config of that name (``vl/uniter-base``, ``vl/uniter-base.yaml`` or
       ``configs/vl/uniter-base.yaml``: a file under :func:`config_dir`).

    Raises:
        FileNotFoundError: neither (the message names the local path tried, the including file for a ``_base_``,
            and where shipped names come from).
    """
    raw = Path(config).expanduser()
    local = raw if relative_to is None or raw.is_absolute() else Path(relative_to) / raw
    for candidate in (local, local.with_name(local.name + ".yaml")):
        if candidate.is_file():
            return candidate
    if local.is_dir():
        return local
    name = raw.as_posix().removesuffix(".yaml").removeprefix("./").removeprefix("configs/")
    if not raw.is_absolute() and ".." not in Path(name).parts:
        shipped = config_dir() / (name + ".yaml")
        if shipped.is_file():
            return shipped
    if included_by is not None:
        raise FileNotFoundError(
            f"config file {local} does not exist (included by {included_by}) and {config} is not "
            f"the name of a shipped config (`vlbert configs` lists them); write the base's path "
            f"relative to the including file, or a shipped name such as text/default"
        )
    examples = ", ".join(n for n in config_names() if n.split("/")[0] in ("text", "vl"))
    raise FileNotFoundError(
        f"config file {config} does not exist and is not the name of a shipped config "
        f"({examples}, finetune/...: `vlbert configs` lists them; directory {config_dir()})"
    )


def load_run_config(
    path: str | os.PathLike | None, overrides: list[str] | None = None, values: list[tuple[str, Any]] | tuple = ()
) -> dict[str, Any]:
    """Read a YAML run config (a file, or a shipped config by name: ``vl/uniter-base``), set the typed ``values``
    (a tool's flags: ``("training.output_dir", "runs/a #b")``, taken as they are) and then apply the
    ``key.sub=value`` overrides of ``--set`` (values parsed as YAML scalars).

    A config may include others with ``_base_: name`` (or a list of names), as detectron2 / mmengine configs do: a
    name is a path relative to the including file or a shipped config's name, by the rule of ``--config``
    (:func:`resolve_config_path`); the bases are merged in order (sections merged key by key) and the file's own
    entries win; bases may include bases (a cycle is refused).

    Raises:
        FileNotFoundError: the config file does not exist and ``path`` is no shipped config's name
            (:func:`resolve_config_path`).
        ValueError: the file is not valid YAML (the message names the file, line and column, as
            ``path:line:column: problem``), not a YAML mapping, an override is not ``key=value``, or ``_base_``
            includes form a cycle.
    """
    config = _load_with_bases(resolve_config_path(path), ()) if path is not None else {}
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
    """``path``'s mapping over its ``_base_`` includes (resolved by :func:`resolve_config_path` from ``path``'s
    directory)."""
    where = f" (included by {seen[-1]})" if seen else ""
    if path.is_dir():
        raise IsADirectoryError(
            f"config {path}{where} is a directory; name a YAML file in it, e.g. {path / 'default.yaml'}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist{where}; `vlbert configs` lists the shipped ones")
    if path.resolve() in seen:
        raise ValueError(f"{path}: _base_ includes form a cycle ({' -> '.join(map(str, seen))} -> {path})")
    loaded = read_yaml(path, "run config", "fix the syntax there (`vlbert configs` lists working examples)")
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} must hold a YAML mapping (sections model/data/training), got {type(loaded).__name__}")
    bases = loaded.pop("_base_", [])
    bases = [bases] if isinstance(bases, str) else bases
    if not isinstance(bases, list) or not all(isinstance(b, str) and b for b in bases):
        raise ValueError(
            f"{path}: _base_ must be a config file's path relative to this file or a shipped config's "
            f"name, or a list of them, got {bases!r}; write the path (e.g. _base_: ../bases/vl.yaml) or "
            "delete the _base_ line"
        )
    merged: dict[str, Any] = {}
    for base in bases:
        base_path = resolve_config_path(base, relative_to=path.parent, included_by=path)
        _merge(merged, _load_with_bases(base_path, (*seen, path.resolve())))
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
        with contextlib.suppress(ValueError):
            value = float(value)
    _set_path(config, key, value)


def check_sections(config: dict[str, Any], allowed: tuple[str, ...]) -> None:
    """Raise ``ValueError`` for a top-level key that no part of the run reads (usually a typo)."""
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ValueError(f"unknown run config key(s) {unknown}; valid top-level keys are {list(allowed)}")


def dataclass_from_section(cls, values: dict[str, Any] | None, section: str):
    """Build the dataclass ``cls`` from a config section through the one typed reading of config values
    (:func:`vlbert.common.typed_config.from_section`): an unknown key, a value of the wrong type (elements of lists
    and mappings included) or out of the field's range is one line naming the key, what it got and what it takes;
    numbers written as strings (YAML 1.1 reads ``1e-4`` as one) are converted.

    Raises:
        ValueError: unknown key, or a value that is not of (or convertible to) the field's type or out of range.
    """
    return from_section(cls, values, section)


__all__ = ["load_run_config", "set_dotted", "check_sections", "dataclass_from_section"]
