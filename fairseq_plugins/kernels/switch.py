"""What the kernel modules (grn_kernel.py, mhc_kernel.py) share about whether their kernels run: the
availability check that torch.compile can trace, and the switch tests flip to compare both paths.

A kernel module keeps its state in its own globals, each library apart: ``_enabled`` (from its
``ENV_SWITCH``; "0" turns it off), ``_library`` and ``_tried`` (set once by its ``loaded()``, which builds and
loads the library on the first call). The helpers here read and set those globals of the module they are
given, so each module's switch stays its own.
"""

import contextlib
import ctypes
import logging
from collections.abc import Callable, Iterator
from types import ModuleType

import torch


def loader(kernel: ModuleType, what: str) -> Callable[[], ctypes.CDLL | None]:
    """``kernel``'s ``loaded()``: its library, loaded (or built by its ``_load``) on the first call whatever the
    switch says; None if it cannot be had (``failure`` says why, and a warning named ``what`` once)."""

    def loaded() -> ctypes.CDLL | None:
        if not kernel._tried:
            with kernel._lock:
                if not kernel._tried:
                    try:
                        kernel._library = kernel._load()
                    except (OSError, ValueError, AttributeError) as err:  # Refused is an OSError; ValueError:
                        # a NUL in $CC; AttributeError: a library without the entry points
                        kernel.failure = str(err)
                        logging.getLogger(kernel.__name__).warning(
                            "%s unavailable, using the PyTorch code (slower): %s", what, kernel.failure)
                    kernel._tried = True
        return kernel._library

    return loaded


def assume_constant_result(fn: Callable) -> Callable:
    """``torch.compiler.assume_constant_result`` without importing ``torch._dynamo``, which that wrapper does first:
    about 1.3 s of CPU, a third of importing the plugin, in every fairseq process (fairseq itself never imports
    it). The decorator only marks the function (torch/_dynamo/decorators.py); tests/test_kernel_switch.py holds
    the mark equal to torch's, so a torch that marks otherwise fails there."""
    fn._dynamo_marked_constant = True
    return fn


def availability(kernel: ModuleType) -> Callable[[], bool]:
    """``kernel``'s ``_available()``: whether its library can be had (loading it on the first call)."""

    @assume_constant_result
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
