"""Reading pickles from other people without running their code.

Pickles can name any importable callable, and ``pickle.load`` calls it: a downloaded checkpoint can run code. The
files this project reads as pickles hold plain data (RefCOCO's ``refs(unc).p``: lists and dicts; detectron2 and
Detectron checkpoints ``*.pkl``: dicts of numpy arrays), so :func:`load_plain_pickle` admits only the globals those
need and refuses every other one before anything is called.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

#: What a pickle of numpy arrays asks for (numpy 1.x and 2.x module names), plus OrderedDict, which
#: detectron2's own checkpoints use for their state dicts. None of these can run code of the file's choosing.
NUMPY_GLOBALS = frozenset(
    {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("collections", "OrderedDict"),
    }
)


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, allowed: frozenset, **kwargs):
        super().__init__(file, **kwargs)
        self.allowed = allowed

    def find_class(self, module: str, name: str):
        if (module, name) in self.allowed:
            return super().find_class(module, name)
        what = "plain containers, strings, numbers" + (" and numpy arrays" if self.allowed else "")
        raise pickle.UnpicklingError(
            f"the pickle asks for {module}.{name}; only {what} are read (convert the "
            "file to JSON or safetensors if it holds other objects)"
        )


def load_plain_pickle(path: str | os.PathLike, numpy_arrays: bool = False):
    """Read a pickle of plain data: dict, list, tuple, set, str, bytes, int, float, bool, None, and with
    ``numpy_arrays`` numpy arrays, dtypes and scalars (and OrderedDict). Python 2 pickles are read with latin-1.

    Args:
        path: the pickle file.
        numpy_arrays: admit numpy arrays (detectron2 ``.pkl`` checkpoints); object arrays still go through the
            same check for whatever they hold.
    Returns:
        the unpickled object.
    Raises:
        FileNotFoundError: no such file.
        ValueError: the pickle asks for any other class or function (a payload that would run code, a custom
            class); the message names what it asked for. Also a truncated or corrupt pickle.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pickle {path} does not exist")
    allowed = NUMPY_GLOBALS if numpy_arrays else frozenset()
    try:
        return _RestrictedUnpickler(io.BytesIO(path.read_bytes()), allowed, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError) as e:
        raise ValueError(f"{path}: {e or 'truncated pickle'}") from e


__all__ = ["load_plain_pickle", "NUMPY_GLOBALS"]
