"""Install the fairseq plugin as a package: ``pip install .`` (or ``-e .``) brings the pinned stack and the
``fairseq-residual`` command (docs/cli.md).

The versions are stated once, in scripts/requirements.txt (scripts/setup_env.sh installs them from there too);
this file reads them and leaves out the test and lint tools. Python 3.11 only: the one fairseq build that
imports on it, ve-fairseq, ships cp311 wheels only, and upstream fairseq==0.12.2 does not import on 3.11
(docs/fairseq_build.md).
"""

from pathlib import Path

from setuptools import find_packages, setup

REQUIREMENTS = Path(__file__).resolve().parent / "scripts" / "requirements.txt"
# the test and lint tools of requirements.txt: the repository's tests need them, an installed plugin does not
DEVELOPMENT_ONLY = {"pytest", "pytest-xdist", "execnet", "hypothesis", "ruff"}


def runtime_requirements() -> list[str]:
    pins = []
    for line in REQUIREMENTS.read_text().splitlines():
        pin = line.split("#")[0].strip()
        if pin and pin.split("==")[0].strip().lower() not in DEVELOPMENT_ONLY:
            pins.append(pin)
    return pins


setup(
    name="fairseq-residual-plugins",
    version="0.1.0",
    description="ResiDual, Crossformer and DeepCrossAttention for fairseq NMT, as a --user-dir plugin",
    packages=find_packages(include=["fairseq_plugins", "fairseq_plugins.*"]),
    package_data={"fairseq_plugins.kernels": ["*.c"]},  # the GRN kernels' source, compiled on first use
    py_modules=["fairseq_residual"],  # the command's light part and the missing --user-dir hint (docs/cli.md)
    python_requires=">=3.11,<3.12",
    install_requires=runtime_requirements(),
    entry_points={
        "console_scripts": ["fairseq-residual = fairseq_residual:main"],
        # torch imports this group's entry points when it is imported (its out-of-tree backend autoload):
        # the one hook an installed package has in fairseq-generate run without --user-dir
        "torch.backends": ["fairseq_residual = fairseq_residual:install"],
    },
)
