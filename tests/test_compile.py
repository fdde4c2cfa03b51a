"""Compile-ready ideas (issue 58 item 2): every choice of every axis (read from the axis tables, so a new choice
is covered) traces under ``torch.compile(fullgraph=True)`` without a graph break, in a training step (forward
and backward) and in incremental decoding, on its PyTorch path (the C kernels off, as on a GPU), and computes
what the eager model computes; mHC's Sinkhorn no longer reads its logits on the host; one tiny model trains
compiled (aot_eager: AOTAutograd's forward and backward graphs) with the eager model's losses.

The per-choice cases use the ``eager`` backend (dynamo's tracing, no code generation: seconds each) and compile
what ``modules/compiled.compile_ideas`` compiles: the layers and the layer-loop hooks. Every axis' default choice
builds the same model (Pre-LN, no aggregation, no tying, LayerNorm; one layer a side but for aggregation's two):
it is traced once, under the first axis, and the other defaults' cases check that they parse to its arguments.
The norm and tying choices change one module of a layer whatever the residual wiring around it: each is traced in
one residual choice's model (FOLDED, a pair that builds), whose case traces both; its own case checks that the
host's arguments set it. Likewise a residual choice is traced in the model of a depth-aggregation choice that
builds every layer with the residual axis's factory and runs it as a black box x -> y (``none``, DenseFormer,
DLCL, LAuReL, LIMe, which only swaps the attentions' k/v projections: not ``own_layers``, whose branches a residual
choice would change instead): the residual's layers run their own code there, at two layers a side, and the
aggregation's hooks are the same whatever the layer (``none`` is the residual's own model, stacks and all).
Fourteen models fewer, every choice still traced once.
"""

import contextlib

import pytest
import torch
import torch._dynamo
from fairseq.sequence_generator import SequenceGenerator
from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

from fairseq_plugins.axes import tables
from fairseq_plugins.kernels import grn_kernel, mhc_kernel
from fairseq_plugins.kernels.sinkhorn import sinkhorn_tokens_last
from fairseq_plugins.modules.compiled import (
    GRAPHS_PER_LAYER,
    SPARE_GRAPHS,
    compile_ideas,
)
from fairseq_plugins.validation import PluginOptionError

from .helpers import build_model, parse_model_args, random_batch
from .test_grn_kernel import needs_kernel

CHOICES = [(axis, name) for axis, table in tables().items() for name in table]
# a choice whose layers differ by position (depth aggregation) gets two per side, so that a layer index that
# changes between calls is traced too; the others one
LAYERS = {"depth_aggregation": "2"}
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]


# a norm or tying choice (a module of the layer) traced in a residual choice's model, a residual choice traced in
# the model of an aggregation choice that runs the residual's layers as they are: {folded: host case}
FOLDED = {("norm", "rmsnorm"): ("residual", "post"), ("norm", "dyt"): ("residual", "deepnet"),
          ("norm", "derf"): ("residual", "b2t"), ("tying", "key-query"): ("residual", "layerscale"),
          ("tying", "ffn"): ("residual", "rezero"), ("tying", "value"): ("residual", "orthogonal"),
          ("tying", "all"): ("residual", "tfixup"),
          ("residual", "ngpt"): ("depth_aggregation", "none"),
          ("residual", "deepnet"): ("depth_aggregation", "denseformer"),
          ("residual", "hybrid"): ("depth_aggregation", "dlcl"),
          ("residual", "b2t"): ("depth_aggregation", "laurel-rw"),
          ("residual", "admin"): ("depth_aggregation", "laurel-lr"),
          ("residual", "normformer"): ("depth_aggregation", "laurel-pa"),
          ("residual", "post"): ("depth_aggregation", "lime")}  # fmt: skip


def traced_in(case: tuple[str, str]) -> tuple[str, str]:
    """The case whose model traces ``case``: its host's, or its host's host's (a norm in a folded residual)."""
    while case in FOLDED:
        case = FOLDED[case]
    return case


def flag(axis: str, name: str) -> list[str]:
    return [f"--{axis.replace('_', '-')}", name]


def choice_args(axis: str, name: str) -> list[str]:
    layers = LAYERS.get(axis, "1")
    hosted = [arg for case in FOLDED if traced_in(case) == (axis, name) for arg in flag(*case)]
    return [*flag(axis, name), *hosted, "--encoder-layers", layers, "--decoder-layers", layers, *NO_DROPOUT]


# a choice whose model is the one of an earlier case (the axes' defaults at one layer): {case: the traced case}
TRACED_AS: dict[tuple[str, str], tuple[str, str]] = {}
_DEFAULTS = vars(parse_model_args("residual_axes"))
for _axis, _table in tables().items():
    if _axis not in LAYERS and _DEFAULTS.get(_axis) in _table:
        TRACED_AS[_axis, _DEFAULTS[_axis]] = next(iter(TRACED_AS.values()), (_axis, _DEFAULTS[_axis]))


@contextlib.contextmanager
def compiling(kernels: bool = False):
    """The C kernels off (the PyTorch path, as on a GPU) unless ``kernels``; dynamo reset, its counters cleared,
    and a recompile past the limits compile_ideas sets an error (else dynamo would quietly run the rest eagerly);
    the limits it raised restored after."""
    torch._dynamo.reset()
    counters.clear()
    config = torch._dynamo.config
    patch = config.patch(fail_on_recompile_limit_hit=True, recompile_limit=config.recompile_limit,
                         accumulated_recompile_limit=config.accumulated_recompile_limit)  # fmt: skip
    with grn_kernel.enabled(kernels), mhc_kernel.enabled(kernels), patch:
        try:
            yield
        finally:
            torch._dynamo.reset()


def graph_breaks() -> int:
    return sum(counters["graph_break"].values())


def train_step(model, batch):
    """The decoder output of a training forward and every parameter's gradient of a loss it reaches."""
    model.zero_grad(set_to_none=True)
    out, _ = model(*batch)
    out.float().logsumexp(-1).mean().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def decode(model, src, lengths, prev, steps: int = 3):
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        state: dict = {}
        return [model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0]
                for t in range(steps)]  # fmt: skip


def assert_close_all(got, want):
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("axis", "name"), CHOICES, ids=[f"{a}-{n}" for a, n in CHOICES])
def test_every_choice_traces_without_graph_breaks(axis, name):
    traced = TRACED_AS.get((axis, name), (axis, name))
    if traced != (axis, name):  # the same arguments build the same model: the traced case's test traces it
        assert vars(parse_model_args("residual_axes", choice_args(axis, name))) == vars(
            parse_model_args("residual_axes", choice_args(*traced)))  # fmt: skip
        return
    if (axis, name) in FOLDED:  # its host's model holds it: the host's case traces both
        host = traced_in((axis, name))
        assert host in CHOICES and host not in TRACED_AS
        if axis == "residual":  # the host runs the residual's own layers (module docstring)
            assert host[0] == "depth_aggregation" and not tables()[host[0]][host[1]].own_layers
        assert vars(parse_model_args("residual_axes", choice_args(*host)))[axis] == name
        return
    model = build_model("residual_axes", choice_args(axis, name))
    src, lengths, prev = batch = random_batch(model, batch=2, src_len=5, tgt_len=4)
    with compiling():
        compile_ideas(model, backend="eager", fullgraph=True)  # any graph break raises
        model.train()
        got_out, got_grads = train_step(model, batch)  # first: Admin profiles on the first training batch
        with torch.compiler.set_stance("force_eager"):
            want_out, want_grads = train_step(model, batch)
        model.eval()
        with torch.compiler.set_stance("force_eager"):
            want_steps = decode(model, src, lengths, prev)
        got_steps = decode(model, src, lengths, prev)
        assert graph_breaks() == 0, dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] > 0  # something was compiled, not skipped
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-6)
    assert got_grads.keys() == want_grads.keys()
    assert_close_all(got_grads.values(), want_grads.values())
    assert_close_all(got_steps, want_steps)


@needs_kernel
@pytest.mark.parametrize("name", ["mhc", "dca"])
def test_the_cpu_kernels_trace_too(name):
    """With the C kernels on (the CPU default: mHC's and DCA's custom operators) the same compile has no graph
    break either and computes what the eager model computes."""
    model = build_model("residual_axes", ["--depth-aggregation", name, "--encoder-layers", "2", "--decoder-layers",
                                          "2", *NO_DROPOUT])  # fmt: skip
    src, lengths, prev = batch = random_batch(model, batch=2, src_len=5, tgt_len=4)
    with compiling(kernels=True):
        assert mhc_kernel.loaded() is not None and grn_kernel.loaded() is not None
        compile_ideas(model, backend="eager", fullgraph=True)
        model.train()
        with torch.compiler.set_stance("force_eager"):
            want_out, want_grads = train_step(model, batch)
        got_out, got_grads = train_step(model, batch)
        model.eval()
        with torch.compiler.set_stance("force_eager"):
            want_steps = decode(model, src, lengths, prev)
        got_steps = decode(model, src, lengths, prev)
        assert graph_breaks() == 0 and counters["stats"]["unique_graphs"] > 0
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-6)
    assert_close_all(got_grads.values(), want_grads.values())
    assert_close_all(got_steps, want_steps)


def test_beam_search_stays_compiled_past_dynamos_default_limit():
    """Compiled beam search over three batch sizes traces each decoder layer about ten times (modules/compiled.py:
    per-layer cache keys, first, second and later steps, batch sizes): past dynamo's default 8 graphs per code
    object, within the limits compile_ideas raises by the model's need (past them, dynamo would run the remaining
    layers eagerly; here that is an error), and the translations are the eager model's."""
    model = build_model("residual_axes", ["--encoder-layers", "1", "--decoder-layers", "2", *NO_DROPOUT])
    generator = SequenceGenerator([model], model.decoder.dictionary, beam_size=2, max_len_b=5, min_len=5)
    samples = [{"net_input": dict(zip(("src_tokens", "src_lengths"), random_batch(model, n, 5, seed=n)[:2]))}
               for n in (3, 2, 4)]  # fmt: skip
    with compiling():
        before = torch._dynamo.config.recompile_limit
        compile_ideas(model, backend="eager", fullgraph=True)
        assert torch._dynamo.config.recompile_limit == before + GRAPHS_PER_LAYER * 2 + SPARE_GRAPHS
        got = [generator.generate([model], sample) for sample in samples]
        graphs = len(_debug_get_cache_entry_list(type(model.decoder.layers[0]).forward.__code__))
        assert 8 < graphs <= GRAPHS_PER_LAYER * 2, graphs  # 8: dynamo's default recompile_limit
        with torch.compiler.set_stance("force_eager"):
            want = [generator.generate([model], sample) for sample in samples]
    for a, b in zip(got, want, strict=True):
        assert [[h["tokens"].tolist() for h in hyps] for hyps in a] == [[h["tokens"].tolist() for h in hyps] for hyps in b]


def test_admin_profiles_eagerly_under_compile():
    """Admin's profiling pass (the first training batch) reads a variance per sublayer on the host: it runs eagerly
    even where the layers are compiled, so that compiling without fullgraph does not break the graph at every read
    (30 breaks before), and it still profiles."""
    model = build_model("residual_axes", ["--residual", "admin", "--encoder-layers", "1", "--decoder-layers", "1"])
    with compiling():
        compile_ideas(model, backend="eager")
        model.train()
        train_step(model, random_batch(model, batch=2, src_len=5, tgt_len=4))
        assert graph_breaks() == 0, dict(counters["graph_break"])
    assert bool(model.admin_profiled) and (model.encoder.layers[0].omega_init[1] != 1).all()


def test_every_axis_is_covered():
    """The table of cases is the axes' own tables: a new choice is a new case, a lost one fails here."""
    assert {axis for axis, _ in CHOICES} == {"residual", "depth_aggregation", "tying", "norm"}
    assert {"mhc", "mhc-lite", "hc-static", "hc-dynamic", "attnres", "attnres-block", "frac", "mudd", "dca",
            "denseformer", "dlcl", "laurel-pa"} <= {n for a, n in CHOICES if a == "depth_aggregation"}  # fmt: skip
    assert set(FOLDED) <= set(CHOICES) and set(FOLDED.values()) <= set(CHOICES)  # no stale pair


def test_sinkhorn_reads_no_data_and_stays_exact():
    """mHC's Sinkhorn takes one path whatever its logits (no host read of their size): one graph under
    fullgraph for small and huge logits, finite, and equal to the eager result."""
    g = torch.Generator().manual_seed(0)
    small = torch.randn(4, 4, 6, generator=g, requires_grad=True)
    huge = (torch.randn(4, 4, 6, generator=g) * 60).requires_grad_()
    with compiling():
        compiled = torch.compile(sinkhorn_tokens_last, backend="eager", fullgraph=True)
        for x in (small, huge):
            got = compiled(x)
            (grad,) = torch.autograd.grad(got.square().sum(), x)
            want = sinkhorn_tokens_last(x)
            (want_grad,) = torch.autograd.grad(want.square().sum(), x)
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(grad, want_grad)
            assert torch.isfinite(got).all() and torch.isfinite(grad).all()
        assert graph_breaks() == 0 and counters["stats"]["unique_graphs"] == 1


def test_a_tiny_model_trains_compiled():
    """mHC (the choice whose PyTorch path broke 28 times a step), compiled with aot_eager, trains 4 Adam updates
    with the eager model's losses, and the loss goes down. One layer a side (half the compile time of two): a
    changing layer index is traced by the per-choice case."""
    args = ["--depth-aggregation", "mhc", "--encoder-layers", "1", "--decoder-layers", "1", *NO_DROPOUT]
    losses = {}
    for compiled in (False, True):
        model = build_model("residual_axes", args, seed=1).train()
        src, lengths, prev = random_batch(model, batch=4, src_len=6, tgt_len=5, seed=2)
        target = torch.roll(prev, -1, dims=1)  # the next token
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        with compiling():
            if compiled:
                compile_ideas(model, backend="aot_eager", fullgraph=True)
            losses[compiled] = []
            for _ in range(4):
                optimizer.zero_grad()
                logits, _ = model(src, lengths, prev)
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())
                loss.backward()
                optimizer.step()
                losses[compiled].append(loss.item())
            assert graph_breaks() == 0
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-4, atol=1e-5)
    assert losses[True][-1] < losses[True][0]


def test_the_compile_option_compiles_the_layers_and_is_checked():
    """--compile-ideas BACKEND compiles every layer in place (same parameters, same outputs); a bad backend and
    --store-ema (its deep copy would run the original's compiled code) are refused naming the option. Two layers
    a side: every mHC layer is compiled again for its index, six cost three times the time."""
    two = ["--encoder-layers", "2", "--decoder-layers", "2"]
    eager = build_model("mhc_e6d6", two)
    compiled = build_model("mhc_e6d6", [*two, "--compile-ideas", "eager"])
    for side in ("encoder", "decoder"):
        assert all(layer._compiled_call_impl is not None for layer in getattr(compiled, side).layers)
        assert all(layer._compiled_call_impl is None for layer in getattr(eager, side).layers)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    src, lengths, prev = random_batch(eager)
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(src, lengths, prev)[0], eager(src, lengths, prev)[0])
    with pytest.raises(SystemExit):
        parse_model_args("mhc_e6d6", ["--compile-ideas", "triton"])
    with pytest.raises(PluginOptionError, match="--compile-ideas cannot be used with --store-ema"):
        build_model("mhc_e6d6", ["--compile-ideas", "eager", "--store-ema"])
