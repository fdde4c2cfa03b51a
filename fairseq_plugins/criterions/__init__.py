"""Criterions of the plugin (fairseq's ``--user-dir`` does not import this folder by itself)."""
