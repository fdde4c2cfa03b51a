"""Issue 54 item 3: a residual choice whose update is a function of each branch alone (LayerScale, ReZero, Peri-LN,
T-Fixup, NormFormer) composes with the stream carries and with DCA's and MUDD's own layers (modules/site_layers.py's
``BranchChange`` states the maths). Each composed layer is checked against its equations written out in float64
from the layer's own submodules; on one stream at HC's init (the plain residual sum) each composition is the
residual choice's own model; ReZero + HC at initialisation is the identity stream update, T-Fixup's init on the
carry's layers is its own, the ``pre`` carries gain nothing, and what cannot compose is refused saying why. The
grid test builds every new pair."""

import pytest
import torch
from torch import nn

from fairseq_plugins.axes import IncompatibleChoices
from fairseq_plugins.modules.compiled import compile_ideas
from fairseq_plugins.modules.layer_scale import LayerScale
from fairseq_plugins.modules.normformer import HeadScaledLinear, PreNormLinear
from fairseq_plugins.modules.rezero import ReZeroGate
from fairseq_plugins.modules.site_layers import PeriOutput
from fairseq_plugins.validation import PluginOptionError

from .helpers import build_model, random_batch
from .test_compile import (
    NO_DROPOUT,
    assert_close_all,
    compiling,
    decode,
    graph_breaks,
    train_step,
)

SHAPE = ["--encoder-layers", "2", "--decoder-layers", "2", "--dropout", "0"]
HC = ["--depth-aggregation", "hc-static", "--hc-rate", "2"]


def _model(residual: str, aggregation=HC, *extra: str):
    return build_model("residual_axes", [*SHAPE, "--residual", residual, *aggregation, *extra], seed=1).double()


def _randomise_(module: nn.Module, seed: int = 5) -> None:
    """Every parameter to random values (so no scale, gate or mixing weight is 0 or 1 by chance of its init)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.rand(p.shape, generator=g, dtype=p.dtype) * 0.8 + 0.2)


def _attention(layer, n):
    return layer.self_attn(query=n, key=n, value=n, key_padding_mask=None, need_weights=False)[0]


def _ffn(layer, n):
    return layer.fc2(torch.relu(layer.fc1(n)))


def _hc(streams, site, branch):
    """Static hyper-connections, written out: h = sum_j A_m[j] H_j, H'_k = sum_j A_r[j, k] H_j + B[k] branch(h)."""
    a_m, a_r, b = site.static_alpha[:, 0], site.static_alpha[:, 1:], site.static_beta
    h = torch.einsum("tbjc,j->tbc", streams, a_m)
    return torch.einsum("tbjc,jk->tbkc", streams, a_r) + b[:, None] * branch(h)[:, :, None, :]


def _encoder_layer_check(model, g, norms: bool):
    """Encoder layer 0 of ``model`` (randomised) against HC's equations with the branch y -> g(site, y) on
    F(N(h)), N = the layer's LayerNorms if ``norms`` else the identity."""
    layer = model.encoder.layers[0]
    _randomise_(layer)
    streams = torch.randn(5, 3, 2, model.encoder.embed_tokens.embedding_dim, dtype=torch.float64)
    with torch.no_grad():
        out = layer(streams, None)
        sa_norm = layer.self_attn_layer_norm if norms else (lambda h: h)
        ffn_norm = layer.final_layer_norm if norms else (lambda h: h)
        x = _hc(streams, layer.hc[0], lambda h: g("self_attn", _attention(layer, sa_norm(h))))
        x = _hc(x, layer.hc[1], lambda h: g("ffn", _ffn(layer, ffn_norm(h))))
    torch.testing.assert_close(out, x, rtol=1e-12, atol=1e-12)
    return layer


def test_layerscale_with_hyper_connections_scales_each_branch():
    """H' = A_r^T H + B diag(lambda) F(LN(A_m^T H)), one lambda per site."""
    model = _model("layerscale")
    layer = model.encoder.layers[0]
    assert set(layer.site_update) == {"self_attn", "ffn"}
    _encoder_layer_check(model, lambda site, y: layer.site_update[site].scale * y, norms=True)


def test_rezero_with_hyper_connections_gates_each_branch_of_norm_free_sublayers():
    """H' = A_r^T H + B alpha F(A_m^T H): one alpha per layer (the authors' form), no sublayer norms."""
    model = _model("rezero")
    layer = model.encoder.layers[0]
    assert set(layer.site_update) == {"layer"}
    assert not [n for n, m in model.named_modules() if isinstance(m, nn.LayerNorm) and ".layers." in n]
    assert model.encoder.layer_norm is None and model.decoder.layer_norm is None  # --rezero-final-norm false
    _encoder_layer_check(model, lambda site, y: layer.site_update["layer"].alpha * y, norms=False)
    per_sublayer = _model("rezero", HC, "--rezero-gate", "sublayer")
    assert set(per_sublayer.decoder.layers[0].site_update) == {"self_attn", "encoder_attn", "ffn"}


def test_rezero_with_hyper_connections_starts_as_the_identity_stream_update():
    """alpha = 0 and HC's A_r = I: every encoder and decoder layer returns its streams unchanged at init."""
    model = _model("rezero")
    streams = torch.randn(4, 2, 2, model.encoder.embed_tokens.embedding_dim, dtype=torch.float64)
    encoder_out = torch.randn(5, 2, model.encoder.embed_tokens.embedding_dim, dtype=torch.float64)
    with torch.no_grad():
        for layer in model.encoder.layers:
            assert torch.equal(layer(streams, None), streams)
        for layer in model.decoder.layers:
            assert torch.equal(layer(streams, encoder_out, None)[0], streams)
    assert all(isinstance(m, ReZeroGate) and m.alpha.item() == 0 for m in model.decoder.layers[1].site_update.values())


def test_peri_with_hyper_connections_normalises_each_branch():
    """H' = A_r^T H + B LN_out(F(LN_in(A_m^T H))), an output norm per site."""
    model = _model("peri")
    layer = model.encoder.layers[0]
    assert all(isinstance(m, PeriOutput) for m in layer.site_update.values())
    _encoder_layer_check(model, lambda site, y: layer.site_update[site].layer_norm(y), norms=True)


def test_tfixup_with_hyper_connections_has_norm_free_sublayers_and_its_own_init():
    """H' = A_r^T H + B F(A_m^T H), and the layers' weights are T-Fixup's: the same draws as T-Fixup's own layers
    (HC's sites draw no random numbers), the same depth scales on v, out_proj, fc1, fc2 and the embeddings."""
    model = _model("tfixup")
    own = build_model("residual_axes", [*SHAPE, "--residual", "tfixup"], seed=1).double()
    shared = own.state_dict()
    composed = model.state_dict()
    assert {k for k in composed if k not in shared} == {k for k in composed if ".hc." in k or "hc_version" in k}
    for key, value in shared.items():
        torch.testing.assert_close(composed[key], value, rtol=0, atol=0, msg=key)
    assert model.encoder.layer_norm is None and model.decoder.layer_norm is None
    _encoder_layer_check(model, lambda site, y: y, norms=False)


def test_normformer_with_hyper_connections_changes_f_inside_each_sublayer():
    """H' = A_r^T H + B F_nf(LN(A_m^T H)), F_nf's self-attention with NormFormer's head scale before W_O and LN_a
    after it, its FFN with LN_f before fc2; cross-attention stays Pre-LN; fairseq's decoder-side copies are gone."""
    model = _model("normformer")
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        out_proj = layer.self_attn.out_proj
        assert isinstance(out_proj, HeadScaledLinear) and out_proj.head_scale is not None
        assert isinstance(out_proj.attn_ln, nn.LayerNorm) and isinstance(layer.fc2, PreNormLinear)
        assert not isinstance(getattr(layer, "encoder_attn", None) and layer.encoder_attn.out_proj, HeadScaledLinear)
        assert all(getattr(layer, name, None) is None for name in ("attn_ln", "c_attn", "ffn_layernorm", "w_resid"))
    layer = model.encoder.layers[0]
    _encoder_layer_check(model, lambda site, y: y, norms=True)
    with torch.no_grad():  # the check's F_nf, written out: heads scaled, W_O, LN_a; LN_f, fc2
        n = torch.randn(5, 3, layer.embed_dim, dtype=torch.float64)
        attn = layer.self_attn
        heads = attn.out_proj.head_scale.repeat_interleave(layer.embed_dim // attn.num_heads)
        captured = []
        hook = attn.out_proj.register_forward_hook(lambda m, i, o: captured.append(i[0]))
        y = _attention(layer, n)
        hook.remove()
        expected = attn.out_proj.attn_ln(nn.functional.linear(captured[0] * heads, attn.out_proj.weight,
                                                              attn.out_proj.bias))  # fmt: skip
        torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
        h = torch.relu(layer.fc1(n))
        torch.testing.assert_close(_ffn(layer, n), nn.functional.linear(layer.fc2.ffn_layernorm(h), layer.fc2.weight,
                                                                         layer.fc2.bias))  # fmt: skip


def test_normformer_options_a_carry_cannot_run_are_refused():
    cases = ((["--scale-resids"], "--scale-resids"), (["--normformer-impl", "fairseq"], "--normformer-impl fairseq"))
    for extra, option in cases:
        message = f"{option} cannot be used with --depth-aggregation hc-static: "
        with pytest.raises(PluginOptionError) as err:
            _model("normformer", HC, *extra)
        assert str(err.value).startswith(message)
    _model("normformer", ["--depth-aggregation", "denseformer"], "--scale-resids")  # its own layers: lambda works


# the decoder-side NormFormer modules fairseq's decoder layer holds, and where the carry's layers hold them
NORMFORMER_DECODER_KEYS = {".attn_ln.": ".self_attn.out_proj.attn_ln.", ".ffn_layernorm.": ".fc2.ffn_layernorm."}


@pytest.mark.parametrize("residual", ["layerscale", "rezero", "peri", "tfixup", "normformer"])
def test_on_one_stream_at_hcs_init_each_composition_is_the_residual_choices_own_model(residual):
    """Hyper-connections with n = 1 at their init (A_m = A_r = B = 1) is the plain residual sum x + b, so the
    composed model on the residual choice's own weights (every one randomised) computes its own model."""
    own = build_model("residual_axes", [*SHAPE, "--residual", residual], seed=2).double()
    _randomise_(own, seed=7)
    composed = _model(residual, ["--depth-aggregation", "hc-static", "--hc-rate", "1"])
    state = {}
    for key, value in own.state_dict().items():
        for old, new in NORMFORMER_DECODER_KEYS.items():
            key = key.replace(old, new) if key.startswith("decoder.") and residual == "normformer" else key
        state[key] = value
    result = composed.load_state_dict(state, strict=False)
    assert not result.unexpected_keys
    assert all(".hc." in k or "hc_version" in k for k in result.missing_keys), result.missing_keys
    batch = random_batch(own)
    with torch.no_grad():
        torch.testing.assert_close(composed(*batch)[0], own(*batch)[0], rtol=1e-10, atol=1e-10)


def test_layerscale_with_dca_scales_each_branch_where_dca_adds_it():
    """DCA's layer with LayerScale: h = q_in + lambda_a a, f_t = lambda_a a + lambda_m FFN(LN(h)), float64."""
    model = _model("layerscale", ["--depth-aggregation", "dca"])
    layer = model.encoder.layers[1]
    _randomise_(layer.site_update)
    chunks = (torch.randn(2, 5, 3, model.encoder.embed_tokens.embedding_dim, dtype=torch.float64),)
    with torch.no_grad():
        out = layer(*chunks, encoder_padding_mask=None)
        q_in, query, key, value = layer.read_stack(chunks)
        a = layer.site_update["self_attn"].scale * layer.self_attn(query=query, key=key, value=value,
                                                                   need_weights=False)[0]  # fmt: skip
        m = layer.site_update["ffn"].scale * _ffn(layer, layer.final_layer_norm(q_in + a))
    torch.testing.assert_close(out, a + m, rtol=1e-12, atol=1e-12)


def test_peri_with_mudd_normalises_each_branch_where_mudd_adds_it():
    """MUDD's layer with Peri-LN: X'_A = R + LN_a(MHA(LN_Q q, LN_K k, LN_V v)), X' = X'_A + LN_m(FFN(LN(X'_A)))."""
    model = _model("peri", ["--depth-aggregation", "mudd"])
    layer = model.encoder.layers[0]
    _randomise_(layer.site_update)
    ways = tuple(torch.randn(5, 3, model.encoder.embed_tokens.embedding_dim, dtype=torch.float64) for _ in range(4))
    with torch.no_grad():
        out = layer(ways, None)
        q, k, v, r = ways
        a = layer.self_attn(query=layer.self_attn_layer_norm(q), key=layer.key_layer_norm(k),
                            value=layer.value_layer_norm(v), need_weights=False)[0]  # fmt: skip
        x = r + layer.site_update["self_attn"].layer_norm(a)
        x = x + layer.site_update["ffn"].layer_norm(_ffn(layer, layer.final_layer_norm(x)))
    torch.testing.assert_close(out, x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("aggregation", ["hc-static", "mhc", "attnres", "frac", "mudd", "dca"])
def test_pre_carries_have_no_branch_change(aggregation):
    """--residual pre: the carry's own Pre-LN branches, no site_update and no extra module (the golden tests pin
    their values)."""
    model = build_model("residual_axes", [*SHAPE, "--depth-aggregation", aggregation])
    assert not [k for k in model.state_dict() if "site_update" in k]
    assert not any(getattr(layer, "changes_branches", False) for layer in [*model.encoder.layers, *model.decoder.layers])


@pytest.mark.parametrize(("residual", "aggregation", "says"), [
    ("post", "hc-static", "x <- LN(x + F(x))"),
    ("orthogonal", "mhc", "x <- x + F - <x,F>/|x|^2 x"),
    ("rezero", "dca", "sublayers have no input norm"),
    ("tfixup", "mudd", "sublayers have no input norm"),
    ("b2t", "frac", "x <- LN(x_in + x + F(x))"),
    ("hybrid", "attnres", "x <- N(x) + FFN(N(x))"),
    ("mix", "dca", "x <- LN(x + F(x))"),
])  # fmt: skip
def test_what_cannot_compose_is_refused_saying_what_both_own(residual, aggregation, says):
    with pytest.raises(IncompatibleChoices) as err:
        build_model("residual_axes", [*SHAPE, "--residual", residual, "--depth-aggregation", aggregation])
    assert str(err.value).startswith(f"--depth-aggregation {aggregation} cannot be combined with --residual {residual}")
    assert says in str(err.value)


def test_layerscale_eps_follows_each_stack_depth_on_the_carry_layers():
    model = build_model("residual_axes", ["--encoder-layers", "20", "--decoder-layers", "2", "--residual", "layerscale",
                                          "--depth-aggregation", "attnres"])  # fmt: skip
    enc = {m.scale.unique().item() for m in model.encoder.modules() if isinstance(m, LayerScale)}
    dec = {m.scale.unique().item() for m in model.decoder.modules() if isinstance(m, LayerScale)}
    assert enc == {torch.tensor(1e-5).item()} and dec == {torch.tensor(0.1).item()}


@pytest.mark.parametrize(("residual", "aggregation"), [("rezero", "hc-static"), ("normformer", "dca")])
def test_a_changed_branch_traces_without_graph_breaks(residual, aggregation):
    """The change's closures on the carry's layers (one gate per layer) and a carry's own layers with F changed
    inside (``branch_output``) trace under torch.compile(fullgraph=True) (tests/test_compile.py's case, on a
    composed model) and compute what the eager model computes. Every stream carry (hyper-connections, mHC,
    frac-connections, AttnRes) runs the same layers with the change attached (modules/carry_stack.py), only their
    sites differ, and tests/test_compile.py traces each carry's sites: static hyper-connections' are the cheapest to
    trace (mHC's unrolled Sinkhorn took half of this test's CPU)."""
    model = build_model("residual_axes", [*SHAPE, "--residual", residual, "--depth-aggregation", aggregation,
                                          *NO_DROPOUT])  # fmt: skip
    src, lengths, prev = batch = random_batch(model, batch=2, src_len=5, tgt_len=4)
    with compiling():
        compile_ideas(model, backend="eager", fullgraph=True)  # any graph break raises
        model.train()
        got_out, got_grads = train_step(model, batch)
        with torch.compiler.set_stance("force_eager"):
            want_out, want_grads = train_step(model, batch)
        model.eval()
        with torch.compiler.set_stance("force_eager"):
            want_steps = decode(model, src, lengths, prev)
        got_steps = decode(model, src, lengths, prev)
        assert graph_breaks() == 0
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-6)
    assert got_grads.keys() == want_grads.keys()
    assert_close_all(got_grads.values(), want_grads.values())
    assert_close_all(got_steps, want_steps)
