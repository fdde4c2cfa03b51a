"""The value residual and HybridNorm's Q/K/V norms inside fairseq's own MultiheadAttention: the equations in
float64 against a direct multi-head attention, incremental decoding (self-attention cache, cross-attention
static K/V) == the full-sequence pass, and unchanged state_dict names for the projections."""

import math

import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_plugins.modules.hybrid_norm import attach_qkv_norms
from fairseq_plugins.modules.value_residual import attach_value_residual

from .new_ideas_common import DIM, random_input

HEADS = 2
T, S, B = 5, 6, 2
SOFTMAX_TOL = 1e-6  # fairseq's attention softmax runs in float32 even for float64 inputs


def causal(t):
    return torch.triu(torch.full((t, t), float("-inf"), dtype=torch.float64), 1)


def attentions(n, cross=False, seed=0):
    torch.manual_seed(seed)
    kind = {"encoder_decoder_attention": True} if cross else {"self_attention": True}
    return [MultiheadAttention(DIM, HEADS, kdim=DIM, vdim=DIM, **kind).double().eval() for _ in range(n)]


def direct_attention(q, k, v, mask=None):
    split = lambda z: z.reshape(z.shape[0], B, HEADS, -1).permute(1, 2, 0, 3)
    scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(DIM // HEADS)
    if mask is not None:
        scores = scores + mask
    return (scores.softmax(-1) @ split(v)).permute(2, 0, 1, 3).reshape(q.shape[0], B, DIM)


def lin(m, x):
    return x @ m.weight.t() + m.bias


def run_self(attns, x, incremental):
    """x <- x + Attn_n(x) through the stack, full (causal mask) or one position at a time with the cache."""
    if not incremental:
        h = x
        for a in attns:
            h = h + a(h, h, h, attn_mask=causal(T), need_weights=False)[0]
        return h
    state, rows = {}, []
    for t in range(T):
        h = x[t : t + 1]
        for a in attns:
            h = h + a(h, h, h, incremental_state=state, need_weights=False)[0]
        rows.append(h)
    return torch.cat(rows)


def test_value_residual_self_attention():
    attns = attentions(3)
    names = [sorted(a.state_dict()) for a in attns]
    store = attach_value_residual(attns, "learnable")
    assert sorted(attns[0].state_dict()) == names[0]  # layer 1: v_proj.weight/bias unchanged
    assert sorted(attns[1].state_dict()) == sorted(names[1] + ["v_proj.mix.lambdas"])
    with torch.no_grad():
        attns[2].v_proj.mix.lambdas.copy_(torch.tensor([0.3, 0.9], dtype=torch.float64))
        x = random_input(T, B, DIM)
        full = run_self(attns, x, incremental=False)
        torch.testing.assert_close(run_self(attns, x, incremental=True), full, rtol=0, atol=1e-12)
        h, v1 = x, None  # direct: V'_n = l1 V_1 + l2 V_n, U_n = A_n V'_n
        for n, a in enumerate(attns):
            v = lin(a.v_proj, h)
            v1 = v if n == 0 else v1
            lam = (1.0, 0.0) if n == 0 else a.v_proj.mix.lambdas.tolist()
            u = direct_attention(lin(a.q_proj, h), lin(a.k_proj, h), lam[0] * v1 + lam[1] * v if n else v, causal(T))
            h = h + lin(a.out_proj, u)
        torch.testing.assert_close(full, h, rtol=0, atol=SOFTMAX_TOL)
    assert store == {}  # the last layer took V_1 out of the store: nothing outlives the pass


def test_value_residual_cross_attention_static_kv():
    attns = attentions(3, cross=True)
    attach_value_residual(attns, "identity", cross_attention=True)
    with pytest.raises(ValueError, match="cross-attention"):
        attach_value_residual(attentions(2, cross=True), "token", cross_attention=True)
    x, enc = random_input(T, B, DIM, seed=1), random_input(S, B, DIM, seed=2)
    with torch.no_grad():
        full = x
        for a in attns:
            full = full + a(full, enc, enc, static_kv=True, need_weights=False)[0]
        state, rows = {}, []
        for t in range(T):  # step 0 computes and caches the mixed encoder-side values; later steps reuse them
            h = x[t : t + 1]
            for a in attns:
                h = h + a(h, enc, enc, incremental_state=state, static_kv=True, need_weights=False)[0]
            rows.append(h)
        h, v1 = x, None  # direct: V'_n^c = 0.5 V_1^c + 0.5 V_n^c on the encoder side, U_n = A_n V'_n^c
        for n, a in enumerate(attns):
            v = lin(a.v_proj, enc)
            v1 = v if n == 0 else v1
            u = direct_attention(lin(a.q_proj, h), lin(a.k_proj, enc), 0.5 * v1 + 0.5 * v if n else v)
            h = h + lin(a.out_proj, u)
    torch.testing.assert_close(torch.cat(rows), full, rtol=0, atol=1e-12)
    torch.testing.assert_close(full, h, rtol=0, atol=SOFTMAX_TOL)


def test_hybrid_norm_qkv_in_fairseq_attention():
    (attn,) = attentions(1)
    before = sorted(attn.state_dict())
    attach_qkv_norms(attn)
    after = sorted(attn.state_dict())
    assert after == sorted(before + ["q_proj.norm.weight", "k_proj.norm.weight", "v_proj.norm.weight"])
    with torch.no_grad():
        for p in (attn.q_proj.norm.weight, attn.k_proj.norm.weight, attn.v_proj.norm.weight):
            p.copy_(random_input(DIM // HEADS, seed=p.data_ptr() % 97))
        x = random_input(T, B, DIM, seed=3)
        full = run_self([attn], x, incremental=False)
        torch.testing.assert_close(run_self([attn], x, incremental=True), full, rtol=0, atol=1e-12)

        def hn(z, w):  # per-head RMSNorm, eps 1e-5
            heads = z.reshape(T, B, HEADS, -1)
            return (heads / torch.sqrt(heads.square().mean(-1, keepdim=True) + 1e-5) * w).reshape(T, B, DIM)

        q = hn(lin(attn.q_proj, x), attn.q_proj.norm.weight)
        k = hn(lin(attn.k_proj, x), attn.k_proj.norm.weight)
        v = hn(lin(attn.v_proj, x), attn.v_proj.norm.weight)
        expected = x + lin(attn.out_proj, direct_attention(q, k, v, causal(T)))
        torch.testing.assert_close(full, expected, rtol=0, atol=SOFTMAX_TOL)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_hooks_follow_the_attention_dtype(dtype):
    """Attached after the model was converted (as these tests do with .double()): the new mix and norm
    parameters take the projection's dtype (and device), so ``token`` mode runs and nothing stays float32."""
    attns = attentions(3)
    for a in attns:
        a.to(dtype)
    attach_value_residual(attns, "token")
    (normed,) = attentions(1)
    normed.to(dtype)
    attach_qkv_norms(normed)
    for module in attns + [normed]:
        assert {p.dtype for p in module.parameters()} == {dtype}
    x = random_input(T, B, DIM, dtype=dtype)
    with torch.no_grad():
        full = run_self(attns, x, incremental=False)
        assert full.dtype == dtype and torch.isfinite(full).all()
        if dtype == torch.float64:
            torch.testing.assert_close(run_self(attns, x, incremental=True), full, rtol=0, atol=1e-12)
        assert torch.isfinite(run_self([normed], x, incremental=False)).all()


def test_hooks_refuse_a_projection_they_would_silently_drop():
    """Each hook rebuilds the projection from its weight and bias: wrapping the other hook's projection (or a
    fairseq quant-noise Linear, whose noise is a forward pre-hook) would silently lose N_v, the mix or the
    noise, so it is refused with an error naming the projection."""
    from fairseq.modules.quant_noise import quant_noise

    (a,) = attentions(1)
    attach_qkv_norms(a)
    with pytest.raises(ValueError, match="v_proj"):
        attach_value_residual([a])
    b = attentions(2)
    attach_value_residual(b)
    with pytest.raises(ValueError, match="v_proj"):
        attach_qkv_norms(b[1])
    (c,) = attentions(1)
    c.k_proj = quant_noise(c.k_proj, 0.1, 8)
    with pytest.raises(ValueError, match="k_proj"):
        attach_qkv_norms(c)
