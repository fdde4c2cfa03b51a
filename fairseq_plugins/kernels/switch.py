"""What the kernel modules (grn_kernel.py, mhc_kernel.py) share about whether their kernels run: the
availability check that torch.compile can trace, and the switch tests flip to compare both paths.

A kernel module keeps its state in its own globals, each library apart: ``_enabled`` (from its
``ENV_SWITCH``; "0" turns it off), ``_library`` and ``_tried`` (set once by its ``loaded()``, which builds and
loads the library on the first call). The helpers here read and set those globals of the module they are
given, so each module's switch stays its own.
"""

import contextlib
from collections.abc import Callable, Iterator
from types import ModuleType

import torch


def availability(kernel: ModuleType) -> Callable[[], bool]:
    """``kernel``'s ``_available()``: whether its library can be had (loading it on the first call)."""

    @torch.compiler.assume_constant_result
    def constant() -> bool:  # a constant to torch.compile: tracing does not step into the loader
        return kernel.loaded() is not None

    def available() -> bool:
        if torch.compiler.is_compiling():
            return constant()
        return (kernel._library if kernel._tried else kernel.loaded()) is not None

    return available


def switch(kernel: ModuleType) -> Callable[[bool], contextlib.AbstractContextManager[None]]:
    """``kernel``'s ``enabled(on)``: a context manager turning its kernels on or off inside the block."""

    @contextlib.contextmanager
    def enabled(on: bool) -> Iterator[None]:
        """Turn the kernels on or off inside the block (tests compare both paths)."""
        before, kernel._enabled = kernel._enabled, on
        try:
            yield
        finally:
            kernel._enabled = before

    return enabled
