"""What pyproject.toml cannot say: the repository's ``configs/`` ships inside the package as ``vlbert/configs`` (a
package directory mapped onto ``configs/``), so an installed vlbert finds its run configs by name
(``vlbert pretrain --config vl/uniter-base``; vlbert.training.run_config.config_dir). Everything else is in
pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["vlbert", "vlbert.*", "vlbert_base", "vlbert_base.*", "detectors", "detectors.*"])
    + ["vlbert.configs"],
    package_dir={"vlbert.configs": "configs"},
    package_data={"vlbert.configs": ["**/*.yaml"], "detectors": ["configs/*.yaml"]},
)
