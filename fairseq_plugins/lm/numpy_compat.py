"""fairseq 0.12.3 under NumPy >= 2: the language-modeling data path needs ``np.compat.long``.

``TokenBlockDataset`` with ``--sample-break-mode eos`` (one example per sentence, which per-sentence scores
and fairseq's own sentence-level LM set-ups use) builds its index with ``dtype=np.compat.long``; NumPy 2
removed ``numpy.compat``, so loading any such split fails with ``AttributeError``. NumPy's ``long`` alias there
meant Python's int, i.e. ``np.int64`` on the 64-bit platforms fairseq runs on. This adds exactly that one name,
and only where NumPy lacks it; nothing else in NumPy changes.
"""

import types

import numpy as np


def add_compat_long() -> None:
    try:
        np.compat.long  # noqa: B018  (NumPy < 2 has it)
    except AttributeError:
        np.compat = types.SimpleNamespace(long=np.int64)


add_compat_long()
