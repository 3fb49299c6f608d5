"""The detector flags of the commands that build a detector (``vlbert extract``,
``vlbert benchmark extraction``), generated from :data:`vlbert.detectors.backends.DETECTOR_BACKENDS`: ``--backend`` with
the table's names as choices, ``--weights``, ``--weights-sha256``, and one flag per backend option (an option that
several backends have is one flag; a field's metadata gives its ``help`` and may rename its ``flag``; a mapping
field takes ``KEY VALUE`` pairs, the values read as YAML). A new backend's options show up here without an edit.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, Field, fields

import yaml

from vlbert.detectors.backends import DEFAULT_BACKEND, DETECTOR_BACKENDS, backend_list
from vlbert.detectors.config import DetectorConfig, typed_options

_TYPES = {"int": int, "float": float, "str": str}


def option_fields() -> dict[str, tuple[Field, list[str]]]:
    """Every backend option by name: (its field in the first backend that has it, the backends that have it), in
    the table's order."""
    out: dict[str, tuple[Field, list[str]]] = {}
    for backend, entry in DETECTOR_BACKENDS.items():
        for f in fields(entry.options):
            out.setdefault(f.name, (f, []))[1].append(backend)
    return out


def option_flag(name: str) -> str:
    """The flag of the option ``name`` (``--input-size``; ``--opts`` for detectron2's ``overrides``)."""
    f, _ = option_fields()[name]
    return f.metadata.get("flag", "--" + name.replace("_", "-"))


def add_detector_arguments(parser: argparse.ArgumentParser, default_backend: str = DEFAULT_BACKEND) -> None:
    """Add the detector flags to ``parser`` (in an argument group "detector"); every flag defaults to None, "not
    given", so that :func:`detector_from_arguments` keeps the options' own defaults."""
    group = parser.add_argument_group("detector (the run configs' detector section; docs/regions.md)")
    backends = "; ".join(f"{name}: {entry.summary}" for name, entry in DETECTOR_BACKENDS.items())
    group.add_argument("--backend", choices=list(DETECTOR_BACKENDS), help=f"{backends} (default {default_backend})")
    group.add_argument(
        "--weights",
        help="weights file (default: the backend's own: packaged ImageNet weights for "
        "timm's efficientnet_lite0, torchvision's COCO weights when online)",
    )
    group.add_argument(
        "--weights-sha256",
        help="the weights file's expected sha256 (sha256sum): refused when the "
        "file has another; detector.json records it either way",
    )
    for name, (f, owners) in option_fields().items():
        default = f.default if f.default is not MISSING else f.default_factory()
        said = f" (default {default})" if default not in ("", {}) else ""
        kwargs = {"dest": name, "help": f"{'/'.join(owners)}: {f.metadata.get('help', name)}{said}"}
        if f.type == "dict":
            kwargs.update(nargs="+", metavar="KEY VALUE")
        else:
            kwargs["type"] = _TYPES[f.type]
        group.add_argument(option_flag(name), **kwargs)


def detector_options(args: argparse.Namespace, default_backend: str = DEFAULT_BACKEND):
    """(backend name, its options dataclass) of the flags; options not given keep their defaults, the same
    defaults the run configs' ``detector`` section has. Not validated (:class:`DetectorConfig` does that).

    Raises:
        ValueError: an option flag of another backend (the backends that have it said), or a ``KEY VALUE`` flag
            with an odd number of words.
    """
    backend = args.backend or default_backend
    entry = DETECTOR_BACKENDS[backend]
    given = {name: getattr(args, name) for name in option_fields() if getattr(args, name, None) is not None}
    for name, value in given.items():
        owners = option_fields()[name][1]
        if backend not in owners:
            raise ValueError(
                f"{option_flag(name)} is an option of the {backend_list(owners)}, not of "
                f"{backend}; drop it, or pass --backend {owners[0]}"
            )
        if option_fields()[name][0].type == "dict":
            if len(value) % 2:
                raise ValueError(f"{option_flag(name)} takes KEY VALUE pairs, got {len(value)} words")
            given[name] = {k: yaml.safe_load(v) for k, v in zip(value[::2], value[1::2], strict=True)}
    return backend, typed_options(entry.options, given, "the detector flags")


def detector_from_arguments(args: argparse.Namespace, default_backend: str = DEFAULT_BACKEND) -> DetectorConfig:
    """The :class:`DetectorConfig` of the flags (:func:`detector_options`, ``--weights``, ``--weights-sha256``).

    Raises:
        ValueError: from :func:`detector_options` and the config's validation.
    """
    backend, options = detector_options(args, default_backend)
    return DetectorConfig(
        backend=backend, weights=args.weights or "", weights_sha256=args.weights_sha256 or "", options=options
    )


__all__ = ["add_detector_arguments", "detector_options", "detector_from_arguments", "option_fields", "option_flag"]
