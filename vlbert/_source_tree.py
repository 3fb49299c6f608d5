"""A checkout used without installing it: ``detectors/`` as ``vlbert.detectors`` (imported first by
:mod:`vlbert`)."""


def _detectors_beside_the_package() -> None:
    """A checkout used without installing it (its root on ``PYTHONPATH``, as on a machine without a package
    index): the folder ``detectors/``, which setup.py installs as ``vlbert.detectors``, is imported from beside this
    package under that name. An installed vlbert (a wheel, or ``pip install -e``, whose finder maps the folder) finds
    it already and is left alone."""
    import importlib.util
    import sys
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "detectors"
    if "vlbert.detectors" in sys.modules or importlib.util.find_spec("vlbert.detectors") is not None:
        return
    if (folder / "__init__.py").is_file():
        spec = importlib.util.spec_from_file_location(
            "vlbert.detectors", folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["vlbert.detectors"] = module
        spec.loader.exec_module(module)


_detectors_beside_the_package()
