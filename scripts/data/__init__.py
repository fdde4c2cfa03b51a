"""Data preparation: download, tokenise and binarise the translation corpora (Multi30k, IWSLT14, WMT14, OPUS-100)."""
