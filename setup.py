"""What pyproject.toml cannot say: two folders of the repository install inside the vlbert package (package
directories mapped onto them): ``configs/`` as ``vlbert.configs``, so an installed vlbert finds its run configs by
name (``vlbert pretrain --config vl/uniter-base``; vlbert.training.run_config.config_dir), and ``detectors/`` (the
region layer, the design card's top-level folder) as ``vlbert.detectors``, a name that cannot collide with another
distribution's ``detectors``. The repository's tools stay out of the wheel: ``benchmarks/`` (``python -m benchmarks``
from a clone; ``vlbert benchmark`` runs it there), ``tools/`` and ``tests/``. Everything else is in
pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["vlbert", "vlbert.*"])
    + ["vlbert.configs"]
    + ["vlbert." + name for name in find_packages(include=["detectors", "detectors.*"])],
    package_dir={"vlbert.configs": "configs", "vlbert.detectors": "detectors"},
    package_data={"vlbert.configs": ["**/*.yaml"], "vlbert.detectors": ["configs/*.yaml"]},
)
