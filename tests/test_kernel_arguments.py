"""Every custom operator of the plugin (``torch.ops.fairseq_plugins.*``, forwards and backwards, found in the
dispatcher and in the sources, so that a new one is covered or this test fails) refuses every malformed tensor
argument (float16, float64, int32, bfloat16, a meta tensor, one dimension more or less, one entry more in any
dimension, an empty dimension) with a one-line ValueError before any C call, and gives the same result for a
non-contiguous or negative-view copy of an argument; a thread count above the C code's 1024 is capped, not
refused (issue 56). For the refusals the C library is replaced by one whose every call fails the test, so a
check that comes too late shows as that failure, not as a crash."""

import re
from pathlib import Path

import pytest
import torch

import fairseq_plugins

# grn_ops and mhc_ops register the operators
from fairseq_plugins.kernels import grn_kernel, grn_ops, hc_kernel, mhc_kernel, mhc_ops

NAMESPACE = "fairseq_plugins"
N, T, C = 2, 5, 9  # streams, tokens, width (9: the C loops' vector part and tail)
K, KH = 2 * N + N * N, N * (N + 2)  # mHC's and dynamic HC's coefficient rows


GEN = torch.Generator()


@pytest.fixture(autouse=True)
def seeded():
    GEN.manual_seed(0)  # the same examples whichever tests run before


def rand(*shape):
    return torch.randn(*shape, generator=GEN)


def grn_forward():
    return {"b": rand(3, 3, 8), "w": rand(3, 8), "norm_weight": rand(8), "norm_bias": rand(8), "norm_eps": 1e-5,
            "with_norm": True, "chunks": [rand(2, 2, 3, 8), rand(1, 2, 3, 8)]}  # fmt: skip


def grn_backward():
    return {"b": rand(3, 3, 8), "w": rand(3, 8), "norm_weight": rand(8), "with_norm": True, "grad": rand(3, 2, 3, 8),
            "grad_first": rand(2, 3, 8), "mean": rand(3, 6), "rstd": rand(3, 6).abs() + 0.5, "rho": rand(3, 6).abs(),
            "dot": rand(3, 3, 6), "norm_weight_grad": True, "norm_bias_grad": True,
            "chunks": [rand(2, 2, 3, 8), rand(1, 2, 3, 8)]}  # fmt: skip


def grn_backward_plain():  # no LayerNorm, no w: the statistics forward did not save come as empty tensors
    return {"b": rand(1, 3, 1), "w": None, "norm_weight": None, "with_norm": False, "grad": rand(1, 4, 8),
            "grad_first": None, "mean": rand(0), "rstd": rand(0), "rho": rand(0), "dot": rand(0),
            "norm_weight_grad": False, "norm_bias_grad": False, "chunks": [rand(3, 4, 8)]}  # fmt: skip


def hc_coef():
    return {"x": rand(T, N, C), "weight": rand(C), "bias": rand(C), "w": rand(N + 2, C), "static": rand(KH),
            "scale": rand(KH), "n": N, "eps": 1e-5}  # fmt: skip


def hc_coef_backward():
    return {"x": rand(T, N, C), "weight": rand(C), "bias": rand(C), "w": rand(N + 2, C), "scale": rand(KH),
            "z": rand(KH, T).tanh(), "grad": rand(KH, T), "n": N, "eps": 1e-5}  # fmt: skip


# valid arguments of every operator (one or more examples each)
EXAMPLES = {
    "grn_forward": [grn_forward],
    "grn_backward": [grn_backward, grn_backward_plain],
    "mhc_gates": [lambda: {"logits": rand(K, T), "n": N, "iters": 3}],
    "mhc_gates_backward": [lambda: {"logits": rand(K, T), "grad": rand(K, T), "n": N, "iters": 3}],
    "mhc_mix": [lambda: {"x": rand(T, N, C), "coef": rand(K, T), "n": N}],
    "mhc_mix_backward": [
        lambda: {"x": rand(T, N, C), "coef": rand(K, T), "grad_u": rand(T, C), "grad_mixed": rand(T, N, C), "n": N}
    ],
    "mhc_post": [lambda: {"mixed": rand(T, N, C), "post": rand(N, T), "out": rand(T, C), "n": N}],
    "mhc_post_backward": [lambda: {"grad": rand(T, N, C), "post": rand(N, T), "out": rand(T, C), "n": N}],
    "hc_coef": [hc_coef],
    "hc_coef_backward": [hc_coef_backward],
}
# the Python function behind each operator, which eager autograd calls without the dispatcher (that resolves
# negative views for the operators)
EAGER = {
    "grn_forward": grn_ops._forward_kernel,
    "grn_backward": grn_ops._backward_kernel,
    "mhc_gates": mhc_ops._forward_kernel,
    "mhc_gates_backward": mhc_ops._backward_kernel,
    "mhc_mix": mhc_kernel.mix_forward,
    "mhc_mix_backward": mhc_kernel.mix_backward,
    "mhc_post": mhc_kernel.post_forward,
    "mhc_post_backward": mhc_kernel.post_backward,
    "hc_coef": mhc_ops._hc_coef_forward,
    "hc_coef_backward": hc_kernel.hc_coefficients_backward,
}
# (operator, argument, dimension) whose size may change alone: another valid call (more tokens, a wider stream)
FREE = {("mhc_gates", "logits", 1), ("mhc_mix", "x", 2), ("hc_coef", "x", 0)}


def registered() -> set[str]:
    prefix = f"{NAMESPACE}::"
    return {name[len(prefix) :] for name in torch._C._dispatch_get_all_op_names() if name.startswith(prefix)}


def declared() -> set[str]:
    """The operators the package's sources name, imported or not."""
    root = Path(fairseq_plugins.__file__).parent
    return {m for p in root.rglob("*.py") for m in re.findall(rf"[\"']{NAMESPACE}::(\w+)", p.read_text())}


def schema(name: str):
    return getattr(getattr(torch.ops, NAMESPACE), name).default._schema


def tensor_arguments(name: str) -> list[str]:
    return [a.name for a in schema(name).arguments if "Tensor" in str(a.type)]


class ReachedC(BaseException):  # not an Exception: no check of the code under test can catch it
    pass


class NoLibrary:
    """In place of a C library: every entry point fails the test when called."""

    def __getattr__(self, entry):
        def call(*args):
            raise ReachedC(f"{entry} was called")

        return call


@pytest.fixture
def no_c(monkeypatch):
    for kernel in (grn_kernel, mhc_kernel):  # hc_kernel calls through mhc_kernel's library
        monkeypatch.setattr(kernel, "_library", NoLibrary())
        monkeypatch.setattr(kernel, "_tried", True)


@pytest.fixture
def real_c():
    for kernel in (grn_kernel, mhc_kernel):
        if kernel.loaded() is None:
            pytest.skip(f"no kernel library here: {kernel.failure}")


def call(name: str, kwargs: dict, via: str = "operator"):
    return getattr(getattr(torch.ops, NAMESPACE), name)(**kwargs) if via == "operator" else EAGER[name](**kwargs)


def slots(kwargs: dict, name: str):
    """(label, getter, setter) of each tensor in the example: the argument, or each element of a list."""
    value = kwargs[name]
    if isinstance(value, list):
        for i in range(len(value)):
            yield f"{name}[{i}]", (lambda i=i: kwargs[name][i]), (lambda t, i=i: {**kwargs, name: [
                *kwargs[name][:i], t, *kwargs[name][i + 1 :]]})  # fmt: skip
    elif value is not None:
        yield name, (lambda: kwargs[name]), (lambda t: {**kwargs, name: t})


def malformed(t: torch.Tensor):
    """(what, tensor, dimension or None) for each malformed version of t: refused by every operator."""
    for dtype in (torch.float16, torch.float64, torch.int32, torch.bfloat16):
        yield f"dtype {dtype}", t.to(dtype), None
    yield "meta device", t.to("meta"), None
    yield "one dimension more", t.unsqueeze(0), None
    yield "one dimension less", t.flatten(0, 1) if t.dim() >= 2 else t.new_zeros(()), None
    for d in range(t.dim()):
        yield f"dimension {d} one longer", torch.cat([t, t.narrow(d, 0, 1) if t.size(d) else t.new_zeros(
            *t.shape[:d], 1, *t.shape[d + 1 :])], d), d  # fmt: skip
        if t.size(d):
            yield f"dimension {d} empty", t.narrow(d, 0, 0), None


def cases() -> list:
    return [pytest.param(name, build, id=f"{name}-{k}") for name, builders in sorted(EXAMPLES.items())
            for k, build in enumerate(builders)]  # fmt: skip


def test_every_operator_has_examples_that_give_every_tensor_argument():
    assert registered() >= {"grn_forward", "mhc_gates"}, registered()
    ops = registered() | declared()
    assert ops == set(EXAMPLES) == set(EAGER), f"operators without examples here: {sorted(ops - set(EXAMPLES))}"
    for name, builders in EXAMPLES.items():
        names = [a.name for a in schema(name).arguments]
        given = set()
        for build in builders:
            kwargs = build()
            assert list(kwargs) == names, (name, list(kwargs), names)
            given |= {arg for arg in tensor_arguments(name) if kwargs[arg] is not None}
        assert given == set(tensor_arguments(name)), f"{name}: no example gives {set(tensor_arguments(name)) - given}"


@pytest.mark.parametrize("name,build", cases())
def test_malformed_tensor_arguments_are_refused_before_the_c_code(no_c, name, build):
    kwargs = build()
    with pytest.raises(ReachedC):  # the example is valid: it gets as far as the C code
        call(name, kwargs)
    tried = 0
    for arg in tensor_arguments(name):
        for label, get, put in slots(kwargs, arg):
            for what, bad, dim in malformed(get()):
                if dim is not None and (name, arg, dim) in FREE:
                    with pytest.raises(ReachedC):  # another valid call
                        call(name, put(bad))
                    continue
                with pytest.raises(ValueError) as err:
                    call(name, put(bad))
                message = str(err.value)
                assert "\n" not in message and "cannot take" in message, (name, label, what, message)
                if dim is None and "dimension" not in what:  # dtype, device: the argument is named
                    assert re.search(rf"(?<!\w){re.escape(label)}(?![\w\[])", message), (name, label, what, message)
                tried += 1
    assert tried >= 8 * sum(len(list(slots(kwargs, arg))) for arg in tensor_arguments(name))


def test_chunk_counts_and_sizes_the_c_code_refuses_are_refused_first(no_c):
    chunk, b = rand(1, 4, 8), rand(1, 1, 8)
    for chunks in ([], [chunk] * 4):  # 1 to 3 chunks
        with pytest.raises(ValueError, match=f"{len(chunks)} chunks"):
            call("grn_forward", {**grn_forward(), "b": b.expand(1, len(chunks), 8), "w": None, "chunks": chunks})
    entries = grn_kernel.MAX_ENTRIES + 1  # a chunk of more entries than grn_cpu.c takes (expanded: no memory)
    chunks, b = [torch.zeros(1, 1, 1).expand(entries, 1, 1)], torch.zeros(1, 1, 1).expand(1, entries, 1)
    assert not grn_kernel.usable(chunks, b)  # the GRN runs its PyTorch code
    with pytest.raises(ValueError, match=f"at most {grn_kernel.MAX_ENTRIES} entries"):
        grn_kernel.forward(chunks, b, None, None, None, 1e-5, False, save=False)


def test_an_output_buffer_that_overlaps_an_input_is_not_written(real_c):
    kwargs = grn_forward()
    chunks, b, w, weight, bias = (kwargs[k] for k in ("chunks", "b", "w", "norm_weight", "norm_bias"))
    first, h, _ = grn_kernel.forward(chunks, b, w, weight, bias, 1e-5, True, save=False)
    for name in ("b", "w", "norm_weight", "norm_bias", "chunks"):
        memory = torch.zeros(first.numel() + h.numel())
        out = (memory[: first.numel()].view_as(first), memory[first.numel() :].view_as(h))  # apart from each other
        t = chunks[0] if name == "chunks" else kwargs[name]
        inside = memory[: t.numel()].view_as(t).copy_(t)  # the same values, in the memory of out
        inputs = {**kwargs, name: [inside, *chunks[1:]] if name == "chunks" else inside}
        got = grn_kernel.forward(inputs["chunks"], inputs["b"], inputs["w"], inputs["norm_weight"], inputs["norm_bias"],
                                 1e-5, True, save=False, out=out)  # fmt: skip
        assert same(got[:2], (first, h)), name


def same(a, b) -> bool:
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("via", ["operator", "eager"])
@pytest.mark.parametrize("name,build", cases())
def test_layouts_the_c_code_cannot_read_are_copied_not_misread(real_c, name, build, via):
    kwargs = build()
    expected = call(name, kwargs, via)
    for arg in tensor_arguments(name):
        for label, get, put in slots(kwargs, arg):
            t = get()
            strided = torch.empty(*t.shape, 2).select(-1, 1).copy_(t)  # every stride doubled
            negative = (-t)._neg_view()  # the values of t, the memory of -t
            for what, other in (("non-contiguous", strided), ("negative view", negative)):
                assert same(call(name, put(other), via), expected), (name, label, what)


@pytest.mark.parametrize("name,build", cases())
def test_more_threads_than_the_c_code_takes_are_capped(real_c, name, build):
    kwargs = build()
    before = torch.get_num_threads()
    expected = call(name, kwargs)
    torch.set_num_threads(1025)  # OMP_NUM_THREADS=1025 does the same
    try:
        assert same(call(name, kwargs), expected)  # tiny calls run on one thread either way
    finally:
        torch.set_num_threads(before)


def test_no_error_asks_the_user_to_report_it():
    root = Path(fairseq_plugins.__file__).parent.parent
    found = [str(p.relative_to(root)) for where in ("fairseq_plugins", "scripts") for p in (root / where).rglob("*.py")
             if "please report" in p.read_text().lower()]  # fmt: skip
    assert not found, found
