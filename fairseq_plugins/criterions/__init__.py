"""Criterions of the plugin (fairseq's ``--user-dir`` does not import this folder by itself)."""

from . import label_smoothed_cross_entropy_with_guidance  # noqa: F401
