"""No training step leaves tensors behind.

The plugin's custom autograd functions share per-pass objects between their ctx (AttnRes's sources, MUDD's bank):
if such an object holds a tensor with autograd history, ctx -> object -> tensor -> grad_fn -> ctx is a cycle
through the autograd graph that Python's collector cannot see, and every step's graph stays alive. Full AttnRes
at E12D12 width 64 grew to 22 GB in 150 updates that way before it was found. Each architecture below takes
training steps; after the first two (warm caches), the live tensors must not grow in both of two windows
of three more (a leak grows in each; a cache filled once, or garbage of other tests freed, moves one). The list covers
every custom autograd function of the plugin (checked: a new one fails the coverage test until an architecture
that runs it is added).

The models have three layers a side (a first, a middle and a last layer: each architecture runs the same custom
functions as at its preset's six, checked when this was set), and the objects alive before the counted steps are
frozen out of the collector (``gc.freeze``), so that each count scans only what the steps made rather than every
object of torch, pytest and earlier tests (a second each).
"""

import contextlib
import gc
import itertools

import pytest
import torch

import fairseq_plugins  # noqa: F401  (registers the plugin and imports every module)
from fairseq_plugins.kernels import grn_kernel, mhc_kernel

from .helpers import build_model, random_batch

ARCHS = [
    "transformer_preln_iwslt_e6d6",  # control
    "attnres_iwslt_e6d6",
    "attnres_block_iwslt_e6d6",
    "mudd_iwslt_e6d6",
    "dca_iwslt_e6d6",
    "dca_k2_iwslt_e6d6",
    "denseformer_iwslt_e6d6",
    "dlcl_iwslt_e6d6",
    "hc_static_iwslt_e6d6",
    "hc_dynamic_iwslt_e6d6",
    "mhc_iwslt_e6d6",
    "mhc_lite_iwslt_e6d6",
    "frac_iwslt_e6d6",
]
# the families with fused kernels also run their PyTorch code (kernels off, as without a C compiler)
WITH_KERNELS = {"dca_iwslt_e6d6", "dca_k2_iwslt_e6d6", "denseformer_iwslt_e6d6", "dlcl_iwslt_e6d6",
                "hc_static_iwslt_e6d6", "hc_dynamic_iwslt_e6d6", "mhc_iwslt_e6d6", "mhc_lite_iwslt_e6d6",
                "frac_iwslt_e6d6"}  # fmt: skip
CASES = [(arch, True) for arch in ARCHS] + [(arch, False) for arch in ARCHS if arch in WITH_KERNELS]
# runs only to raise an error in backward (a gradient the GRN kernel does not provide): no training step reaches it
NOT_IN_TRAINING = {"fairseq_plugins.kernels.grn_ops._Undifferentiable"}


def _plugin_functions() -> dict[str, type]:
    found, todo = {}, list(torch.autograd.Function.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__module__.startswith("fairseq_plugins"):
            found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def _live_tensors() -> int:
    """Tensors and custom-function contexts alive (a leaked graph keeps both); type() rather than isinstance,
    which would ask every object, lazy deprecated torch attributes included, and warn."""
    gc.collect()
    kinds = (torch.Tensor, torch.autograd.function.BackwardCFunction)
    return sum(1 for o in gc.get_objects() if issubclass(type(o), kinds))


@contextlib.contextmanager
def _kernels(on: bool):
    with grn_kernel.enabled(on), mhc_kernel.enabled(on):
        yield


LAYERS = ["--encoder-layers", "3", "--decoder-layers", "3"]


def _stepper(arch: str):
    model = build_model(arch, LAYERS).train()
    batch = random_batch(model)

    def step():
        logits, _ = model(*batch)
        logits.float().logsumexp(-1).mean().backward()

    return step


@pytest.fixture(scope="module")
def recorded():
    """Every plugin autograd function's forward wrapped to record its name when it runs, for the module: the custom
    functions each case's training steps run (the leak tests' own steps), and the cases that ran."""
    used, stepped = set(), set()
    with pytest.MonkeyPatch.context() as patch:
        for name, cls in _plugin_functions().items():
            forward = cls.forward

            def record(*args, _forward=forward, _name=name, **kwargs):
                used.add(_name)
                return _forward(*args, **kwargs)

            patch.setattr(cls, "forward", staticmethod(record))
        yield used, stepped


@pytest.mark.parametrize("arch, kernels", CASES, ids=[f"{a}-kernels_{'on' if k else 'off'}" for a, k in CASES])
def test_training_steps_leave_no_tensors_behind(arch, kernels, recorded):
    with _kernels(kernels):
        step = _stepper(arch)
        step(), step()
        recorded[1].add((arch, kernels))
        gc.collect()
        gc.freeze()  # what is alive now is never scanned again: the counts read only the objects the steps make
        try:
            counts = [_live_tensors()]
            for _ in range(2):  # a leak grows in both windows; a one-off cache, or other tests' garbage freed, in one
                for _ in range(3):
                    step()
                counts.append(_live_tensors())
        finally:
            gc.unfreeze()
        growth = [b - a for a, b in itertools.pairwise(counts)]
        assert min(growth) <= 0, f"{arch}: tensors or contexts accumulate across training steps ({growth}: an autograd cycle)"


def test_the_architectures_run_every_custom_autograd_function(recorded):
    """The functions the cases' training steps ran, recorded during the leak tests above (a case not run in this
    process, e.g. under -k, takes its step here)."""
    used, stepped = recorded
    for arch, kernels in CASES:
        if (arch, kernels) not in stepped:
            with _kernels(kernels):
                _stepper(arch)()
    missing = set(_plugin_functions()) - used - NOT_IN_TRAINING
    assert not missing, f"no architecture of ARCHS runs {sorted(missing)}: add one that does"
