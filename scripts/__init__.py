"""The repository's tools, each run from the repository root as ``python -m scripts.GROUP.MODULE``."""
