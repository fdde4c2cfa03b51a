"""Norm placements (Peri-LN, Mix-LN, HybridNorm/HybridNorm*, ReZero) and HybridNorm's per-head Q/K/V norms:
each placement against its paper's equations in float64, the per-layer tables, option errors, incremental ==
full decoding for a HybridNorm decoder layer, and 36-layer stacks in half precision."""

import math

import pytest
import torch
import torch.nn.functional as F

from fairseq_plugins.modules.hybrid_norm import HeadNorm
from fairseq_plugins.modules.norm_placement import (
    PERI,
    POST,
    PRE,
    apply_sublayer,
    mix_ln_post_layers,
    stack_norms,
    sublayer_norms,
)

from .new_ideas_common import (
    DIM,
    HALF,
    assert_finite,
    branch,
    branch_weights,
    random_input,
)

HEADS = 2
LN = lambda z: F.layer_norm(z, z.shape[-1:])
NORMS = {"pre": LN, "branch": lambda z: 2 * LN(z), "post": lambda z: LN(z) - 1}  # distinguishable norms


def test_placement_tables():
    assert sublayer_norms("pre", 0, 6, "ffn") == PRE and sublayer_norms("post", 5, 6, "self_attn") == POST
    assert all(sublayer_norms("peri", i, 6, s) == PERI for i in range(6) for s in ("self_attn", "encoder_attn", "ffn"))
    assert [mix_ln_post_layers(n) for n in (3, 4, 6, 12, 24)] == [0, 1, 1, 3, 6]  # authors' POST_NUM 3 and 6
    assert [sublayer_norms("mix", i, 12, "encoder_attn") for i in range(4)] == [POST] * 3 + [PRE]
    hybrid = [sublayer_norms("hybrid", 0, 6, s) for s in ("self_attn", "encoder_attn", "ffn")]
    assert [(h.pre, h.qkv, h.residual_from_pre) for h in hybrid] == [(False, True, False)] * 2 + [(True, False, True)]
    star0 = sublayer_norms("hybrid_star", 0, 6, "self_attn"), sublayer_norms("hybrid_star", 0, 6, "ffn")
    assert (star0[0].pre, star0[0].qkv, star0[1]) == (True, True, PRE)
    assert sublayer_norms("hybrid_star", 1, 6, "ffn") == sublayer_norms("hybrid", 1, 6, "ffn")
    assert stack_norms("post").final is False and stack_norms("mix").final and not stack_norms("peri").embedding
    assert not stack_norms("rezero").final  # the authors' ReZero has no final norm (issue 55)
    assert stack_norms("peri", peri_embedding=True).embedding
    n = sublayer_norms("rezero", 0, 6, "ffn")
    assert not (n.pre or n.branch or n.post or n.qkv)


def test_option_errors():
    for args, match in [(("sandwich", 0, 6, "ffn"), "placement"), (("pre", 0, 6, "cross"), "sublayer"),
                        (("pre", 6, 6, "ffn"), "layer_idx")]:
        with pytest.raises(ValueError, match=match):
            sublayer_norms(*args)
    with pytest.raises(ValueError, match="alpha"):
        mix_ln_post_layers(6, 1.5)
    with pytest.raises(ValueError, match="placement"):
        stack_norms("deepnorm")


@pytest.mark.parametrize("name", ["pre", "post", "peri", "rezero"])
def test_sublayer_equations(name):
    x, w = random_input(4, 2, DIM), branch_weights(1)[0]
    f = lambda z: branch(z, w)
    pre, out, post = NORMS["pre"], NORMS["branch"], NORMS["post"]
    expected = {"pre": x + f(pre(x)), "post": post(x + f(x)), "peri": x + out(f(pre(x))), "rezero": x + f(x)}[name]
    got = apply_sublayer(sublayer_norms(name, 0, 6, "ffn"), x, f, NORMS)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def head_norm_direct(z, weight, eps=1e-5):
    out = torch.empty_like(z)
    for h in range(HEADS):
        s = slice(h * DIM // HEADS, (h + 1) * DIM // HEADS)
        out[..., s] = z[..., s] / torch.sqrt(z[..., s].square().mean(-1, keepdim=True) + eps) * weight
    return out


def test_head_norm_equation():
    norm = HeadNorm(HEADS, DIM // HEADS).double()
    with torch.no_grad():
        norm.weight.copy_(random_input(DIM // HEADS, seed=7))
    z = random_input(5, 3, DIM)
    torch.testing.assert_close(norm(z), head_norm_direct(z, norm.weight.detach()), rtol=0, atol=1e-12)


def attention(x, mem, w, qkv_norms):
    """The normalised per-head Q (from x), K and V (from mem) of HybridNorm's attention, and W_o."""
    wq, wk, wv, wo = w
    q, k, v = qkv_norms[0](x @ wq), qkv_norms[1](mem @ wk), qkv_norms[2](mem @ wv)
    return q, k, v, wo


def attend(q, k, v, wo, causal_offset=None):
    t, b, _ = q.shape
    split = lambda z: z.reshape(z.shape[0], b, HEADS, -1).permute(1, 2, 0, 3)
    scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(DIM // HEADS)
    if causal_offset is not None:
        pos = torch.arange(t).unsqueeze(1) + causal_offset
        scores = scores.masked_fill(torch.arange(k.shape[0]).unsqueeze(0) > pos, float("-inf"))
    return (scores.softmax(-1) @ split(v)).permute(2, 0, 1, 3).reshape(t, b, -1) @ wo


def hybrid_decoder_layer(x, enc, ws, norms, offset=0, cache=None):
    """Y1 = X + SA(X); Y2 = Y1 + CA(Y1, enc); X' = N(Y2) + FFN(N(Y2)), SA/CA with per-head Q/K/V norms;
    with ``cache`` the self-attention's normalised K/V of earlier positions are reused (fairseq's saved_state)."""
    q, k, v, wo = attention(x, x, ws[0], norms[0])
    if cache is not None:
        cache[0].append(k), cache[1].append(v)
        k, v = torch.cat(cache[0]), torch.cat(cache[1])
    spec = sublayer_norms("hybrid", 1, 2, "self_attn")
    y1 = apply_sublayer(spec, x, lambda h: attend(q, k, v, wo, causal_offset=offset), {})
    y2 = apply_sublayer(spec, y1, lambda h: attend(*attention(h, enc, ws[1], norms[1])), {})
    return apply_sublayer(sublayer_norms("hybrid", 1, 2, "ffn"), y2, lambda h: branch(h, ws[2][0]), NORMS)


def test_hybrid_decoder_layer_equations_and_incremental():
    g = torch.Generator().manual_seed(3)
    ws = [[torch.randn(DIM, DIM, generator=g, dtype=torch.float64) / DIM**0.5 for _ in range(4)] for _ in range(3)]
    norms = [[HeadNorm(HEADS, DIM // HEADS).double() for _ in range(3)] for _ in range(2)]
    x, enc = random_input(5, 2, DIM, seed=1), random_input(7, 2, DIM, seed=2)
    full = hybrid_decoder_layer(x, enc, ws, norms)
    # direct: the paper's equations with head_norm_direct, float64
    hn = lambda z: head_norm_direct(z, torch.ones(DIM // HEADS, dtype=torch.float64))
    y1 = x + attend(hn(x @ ws[0][0]), hn(x @ ws[0][1]), hn(x @ ws[0][2]), ws[0][3], causal_offset=0)
    y2 = y1 + attend(hn(y1 @ ws[1][0]), hn(enc @ ws[1][1]), hn(enc @ ws[1][2]), ws[1][3])
    torch.testing.assert_close(full, LN(y2) + branch(LN(y2), ws[2][0]), rtol=0, atol=1e-12)
    cache = ([], [])
    steps = [hybrid_decoder_layer(x[t : t + 1], enc, ws, norms, offset=t, cache=cache) for t in range(5)]
    torch.testing.assert_close(torch.cat(steps), full, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", ["peri", "mix", "hybrid", "hybrid_star"])
def test_deep_stack_half_precision(name, dtype):
    layers = 36
    weights = branch_weights(2 * layers, gain=2.0)
    qkv = HeadNorm(HEADS, DIM // HEADS).to(dtype)
    x = (random_input(6, 2, DIM) * 5).to(dtype).requires_grad_()
    h = x
    for i in range(layers):
        for j, sub in enumerate(("self_attn", "ffn")):
            spec = sublayer_norms(name, i, layers, sub)
            w = weights[2 * i + j]
            f = (lambda z, w=w: branch(qkv(z), w)) if spec.qkv else (lambda z, w=w: branch(z, w))
            h = apply_sublayer(spec, h, f, NORMS)
    out = LN(h)
    assert out.dtype == dtype
    out.float().square().mean().backward()
    assert_finite(h, out, x.grad, *([qkv.weight.grad] if qkv.weight.grad is not None else []))
