"""Install the fairseq plugin as a package (``pip install -e .``); fairseq itself is pinned in
scripts/requirements.txt (see the README for why that build)."""

from setuptools import find_packages, setup

setup(
    name="fairseq-residual-plugins",
    version="0.1.0",
    description="ResiDual, Crossformer and DeepCrossAttention for fairseq NMT, as a --user-dir plugin",
    packages=find_packages(include=["fairseq_plugins", "fairseq_plugins.*"]),
    package_data={"fairseq_plugins.kernels": ["*.c"]},  # the GRN kernels' source, compiled on first use
    python_requires=">=3.10",
)
