"""The garbage collector's settings of the test processes and of the commands the fork servers fork.

The tests build thousands of small models and trace them with dynamo: millions of short-lived objects over a heap
of about a million long-lived ones (torch, fairseq, the collected tests). With CPython's default thresholds
(700, 10, 10) the collector ran every 700 allocations and kept rescanning that heap: a quarter of test_compile's CPU.
So the heap imported so far is frozen (``gc.freeze``: never scanned, never freed) and the youngest generation is
collected every 10,000 allocations. Reference cycles are still collected; a test that counts live objects calls
``gc.collect()`` itself. A fork inherits both settings, and its collections neither scan nor write to the pages
it shares with its server."""

import gc

THRESHOLDS = (10_000, 10, 10)
# the same, as a line of the fork servers' code (they import nothing of this repository)
SERVER_LINES = f"import gc\ngc.freeze()\ngc.set_threshold{THRESHOLDS}\n"


def tune() -> None:
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
