"""Issue 27's residual-site and norm ideas wired as axis choices of ``residual_axes`` (axes/residual_sites.py,
axes/norm.py): incremental == full decoding, the state at initialisation each paper claims at model level,
a checkpoint round trip, half precision finite at E36D6 (tiny width), option errors and refusals."""

import copy
import io

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator
from torch import nn

from fairseq_plugins.axes import IncompatibleChoices
from fairseq_plugins.models.families import NEW_IDEAS
from fairseq_plugins.modules.derf import DynamicErf
from fairseq_plugins.modules.dyt import DynamicTanh
from fairseq_plugins.modules.hybrid_norm import NormedProjection
from fairseq_plugins.modules.layer_scale import LayerScale
from fairseq_plugins.modules.mhc import ManifoldHyperConnection
from fairseq_plugins.modules.orthogonal_residual import OrthogonalResidual
from fairseq_plugins.modules.rezero import ReZeroGate
from fairseq_plugins.modules.site_layers import PeriOutput
from fairseq_plugins.validation import STORED_ARGS, PluginOptionError

from .helpers import (
    TinyTask,
    build_model,
    full_and_incremental_logits,
    parse_model_args,
    random_batch,
)
from .lm_helpers import parse_lm_args, save_checkpoint

FAMILIES = tuple(NEW_IDEAS)  # every preset of the 2024-26 ideas, as the preset table names them
SHAPE = ["--encoder-layers", "4", "--decoder-layers", "4", "--dropout", "0"]


@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_equals_full_and_checkpoint_round_trip(family):
    model = build_model(f"{family}_e6d6", SHAPE, seed=1)
    with torch.no_grad():  # move every parameter off its init so the round trip is not trivially equal
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    batch = random_batch(model)
    full, incremental = full_and_incremental_logits(copy.deepcopy(model).double(), *batch)
    torch.testing.assert_close(incremental, full, rtol=1e-5, atol=1e-6)  # fairseq softmaxes attention in float32
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    fresh = build_model(f"{family}_e6d6", SHAPE, seed=2)
    fresh.load_state_dict(torch.load(buffer))
    with torch.no_grad():
        torch.testing.assert_close(fresh(*batch)[0], model(*batch)[0], rtol=0, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_finite_at_e36d6(family, dtype):
    model = build_model(f"{family}_e36d6", ["--dropout", "0"]).to(dtype).train()
    src, lengths, prev = random_batch(model)
    logits, _ = model(src, lengths, prev)
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), prev.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def _layer_io(model, batch):
    """(input, output) of every encoder and decoder layer on ``batch``."""
    seen = []
    hooks = [
        layer.register_forward_hook(lambda m, i, o: seen.append((i[0], o[0] if isinstance(o, tuple) else o)))
        for side in (model.encoder, model.decoder) for layer in side.layers
    ]  # fmt: skip
    with torch.no_grad():
        model(*batch)
    for h in hooks:
        h.remove()
    return seen


def test_rezero_layers_are_the_identity_at_init():
    """ReZero eq. 1 with alpha = 0: every layer returns its input; no sublayer norms remain."""
    model = build_model("rezero_e6d6", SHAPE)
    for x_in, x_out in _layer_io(model, random_batch(model)):
        torch.testing.assert_close(x_out, x_in, rtol=0, atol=0)
    assert not [n for n, m in model.named_modules() if isinstance(m, nn.LayerNorm) and ".layers." in n]


def test_layerscale_starts_at_caits_eps_per_stack_depth():
    model = build_model("layerscale_e36d6")
    enc = {m.scale.unique().item() for m in model.encoder.modules() if isinstance(m, LayerScale)}
    dec = {m.scale.unique().item() for m in model.decoder.modules() if isinstance(m, LayerScale)}
    assert enc == {torch.tensor(1e-6).item()} and dec == {torch.tensor(0.1).item()}
    sites = sum(isinstance(m, LayerScale) for m in model.decoder.modules())
    assert sites == 6 * 3  # cross-attention has its own lambda
    model = build_model("layerscale_e6d6", ["--layerscale-init", "0.5"])
    assert {m.scale.unique().item() for m in model.modules() if isinstance(m, LayerScale)} == {0.5}


def _site_calls(model, kind):
    calls = []
    hooks = [m.register_forward_hook(lambda m, i, o: calls.append((*i, o))) for m in model.modules() if isinstance(m, kind)]
    with torch.no_grad():
        model.double()(*random_batch(model))
    for h in hooks:
        h.remove()
    return calls


def test_orthogonal_update_is_orthogonal_to_the_stream_per_token():
    model = build_model("ortho_e6d6", SHAPE)
    calls = _site_calls(model, OrthogonalResidual)
    assert len(calls) == 4 * 2 + 4 * 3
    for f, stream, out in calls:
        update = out - stream
        cos = (update * stream).sum(-1) / (update.norm(dim=-1) * stream.norm(dim=-1) + 1e-30)
        assert cos.abs().max() < 1e-5  # eps = 1e-6 in the denominator: orthogonal up to eps / |x|^2
        par = (stream * f).sum(-1, keepdim=True) / (stream.square().sum(-1, keepdim=True) + 1e-6) * stream
        torch.testing.assert_close(out, stream + f - par)  # the paper's equation, float64


def test_peri_ln_adds_a_normalised_branch():
    """x + LN_out(F(LN_in(x))): at init (gain 1, bias 0) every update has mean 0 and variance 1 per token."""
    model = build_model("periln_e6d6", SHAPE)
    calls = _site_calls(model, PeriOutput)
    assert len(calls) == 4 * 2 + 4 * 3
    for _, stream, out in calls:
        update = out - stream
        torch.testing.assert_close(update.mean(-1), torch.zeros_like(update[..., 0]), atol=1e-9, rtol=0)
        torch.testing.assert_close(update.var(-1, unbiased=False), torch.ones_like(update[..., 0]), atol=1e-3, rtol=0)


def test_mix_ln_makes_the_first_quarter_of_each_stack_post_ln():
    model = build_model("mixln_e12d6")
    assert [layer.normalize_before for layer in model.encoder.layers] == [False] * 3 + [True] * 9
    assert [layer.normalize_before for layer in model.decoder.layers] == [False] + [True] * 5
    model = build_model("mixln_e12d6", ["--mix-ln-alpha", "0"])
    assert all(layer.normalize_before for side in (model.encoder, model.decoder) for layer in side.layers)


def _qkv_normed_attention(attn, x):
    """Self-attention with per-head RMS-normalised Q, K, V (HybridNorm section 3), written out in float64."""
    t, b, c = x.shape
    h = attn.num_heads

    def heads(proj):
        z = (x @ proj.weight.T + proj.bias).reshape(t, b, h, c // h)
        z = z / torch.sqrt(z.square().mean(-1, keepdim=True) + 1e-5)
        return (z * proj.norm.weight).permute(1, 2, 0, 3)  # (b, h, t, d)

    q, k, v = (heads(getattr(attn, p)) for p in ("q_proj", "k_proj", "v_proj"))
    a = torch.softmax(q @ k.transpose(-1, -2) / (c // h) ** 0.5, -1) @ v
    return attn.out_proj(a.permute(2, 0, 1, 3).reshape(t, b, c))


def _layer_norm(norm, z):
    return torch.nn.functional.layer_norm(z, z.shape[-1:], norm.weight, norm.bias)


def test_hybrid_norm_layer_equals_its_equations_in_float64():
    """Attention with per-head RMS-normalised Q, K, V and no input norm; FFN x' = N(y) + FFN(N(y))."""
    model = build_model("hybridnorm_e6d6", SHAPE).double()
    layer = model.encoder.layers[0]
    for attn in (layer.self_attn, model.decoder.layers[0].encoder_attn):
        assert all(isinstance(getattr(attn, p), NormedProjection) for p in ("q_proj", "k_proj", "v_proj"))
    assert not [k for k in model.state_dict() if "self_attn_layer_norm" in k or "encoder_attn_layer_norm" in k]
    x = torch.randn(5, 2, layer.embed_dim, dtype=torch.float64)
    with torch.no_grad():
        out = layer(x, None)
        y = x + _qkv_normed_attention(layer.self_attn, x)
        n = _layer_norm(layer.final_layer_norm, y)
        expected = n + layer.fc2(torch.relu(layer.fc1(n)))
    torch.testing.assert_close(out, expected)


def test_hybrid_norm_star_has_a_pre_ln_first_layer():
    """HybridNorm* (--hybrid-first-layer pre): layer 0 of each stack is y = x + Attn(N_a(x)) with the Q/K/V norms
    and x' = y + FFN(N_f(y)); the other layers stay HybridNorm's; decoding incrementally equals full decoding and
    a checkpoint round-trips; pruning is refused."""
    star = ["--hybrid-first-layer", "pre"]
    model = build_model("hybridnorm_e6d6", [*SHAPE, *star], seed=1).double()
    with torch.no_grad():  # every gain and bias off its init, so each norm's place shows
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    first, second = model.encoder.layers[0], model.encoder.layers[1]
    x = torch.randn(5, 2, first.embed_dim, dtype=torch.float64)
    with torch.no_grad():
        y = x + _qkv_normed_attention(first.self_attn, _layer_norm(first.self_attn_layer_norm, x))
        expected = y + first.fc2(torch.relu(first.fc1(_layer_norm(first.final_layer_norm, y))))
        torch.testing.assert_close(first(x, None), expected)
        y = x + _qkv_normed_attention(second.self_attn, x)
        n = _layer_norm(second.final_layer_norm, y)
        torch.testing.assert_close(second(x, None), n + second.fc2(torch.relu(second.fc1(n))))
    decoder_norms = [k for k in model.state_dict() if k.startswith("decoder.") and "attn_layer_norm" in k]
    assert decoder_norms == [f"decoder.layers.0.{s}_attn_layer_norm.{w}" for s in ("self", "encoder") for w in ("weight", "bias")]
    batch = random_batch(model)
    full, incremental = full_and_incremental_logits(copy.deepcopy(model), *batch)
    torch.testing.assert_close(incremental, full, rtol=1e-5, atol=1e-6)
    fresh = build_model("hybridnorm_e6d6", [*SHAPE, *star], seed=2).double()
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(fresh(*batch)[0], model(*batch)[0], rtol=0, atol=0)
    with pytest.raises(PluginOptionError, match="--encoder-layers-to-keep cannot be used with --hybrid-first-layer pre"):
        build_model("hybridnorm_e6d6", [*SHAPE, *star, "--encoder-layers-to-keep", "0,1"])


@pytest.mark.parametrize(("family", "kind"), [("dyt", DynamicTanh), ("derf", DynamicErf)])
def test_dyt_and_derf_replace_every_layernorm(family, kind):
    model = build_model(f"{family}_e6d6", SHAPE)
    assert not [n for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    norms = [m for m in model.modules() if isinstance(m, kind)]
    assert len(norms) == 4 * 2 + 4 * 3 + 2 and all(m.alpha.item() == 0.5 for m in norms)


@pytest.mark.parametrize(("extra", "message"), [
    (["--residual", "layerscale", "--layerscale-init", "2"], "--layerscale-init"),
    (["--residual", "mix", "--mix-ln-alpha", "1.5"], "--mix-ln-alpha"),
    (["--residual", "hybrid", "--hybrid-first-layer", "post"], "--hybrid-first-layer"),
])  # fmt: skip
def test_option_errors_name_the_option(extra, message, capsys):
    with pytest.raises((SystemExit, PluginOptionError)):
        build_model("residual_axes", [*SHAPE, *extra])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("arch", "extra", "message"), [
    ("residual_axes", ["--layerscale-init", "0.5"], "--layerscale-init applies only with --residual layerscale"),
    ("residual_axes", ["--mix-ln-alpha", "0.5"], "--mix-ln-alpha applies only with --residual mix,"),
    ("hybridnorm_star_e6d6", ["--residual", "peri"],
     "--hybrid-first-layer applies only with --residual hybrid, and the model has --residual peri: it would be ignored"),
    ("mhc_e6d6", ["--attnres-block-size", "4"],
     "--attnres-block-size applies only with --depth-aggregation attnres or attnres-block"),
])  # fmt: skip
def test_an_option_of_a_choice_not_made_is_refused(arch, extra, message):
    with pytest.raises(PluginOptionError, match=message):
        build_model(arch, [*SHAPE, *extra])


@pytest.mark.parametrize(("extra", "names"), [
    (["--residual", "hybrid", "--tying", "key-query"], ("--residual hybrid", "--tying key-query")),
    (["--residual", "rezero", "--depth-aggregation", "dca"], ("--depth-aggregation dca", "--residual rezero")),
    (["--residual", "orthogonal", "--depth-aggregation", "hc-static"], ("--depth-aggregation hc-static", "--residual orthogonal")),
    (["--residual", "pre", "--norm", "dyt", "--depth-aggregation", "dca"], ("--depth-aggregation dca", "--norm dyt")),
])  # fmt: skip
def test_refusals_name_both_choices(extra, names):
    with pytest.raises(IncompatibleChoices) as err:
        build_model("residual_axes", [*SHAPE, *extra])
    assert str(err.value).startswith(f"{names[0]} cannot be combined with {names[1]}: ")


def test_value_residual_mixes_the_first_layers_values_in_every_stack():
    """V'_n = 0.5 V_1 + 0.5 V_n (ResFormer, identity mode) in encoder and decoder self-attention, float64."""
    model = build_model("value_residual_e6d6", [*SHAPE, "--value-residual-cross"]).double()
    for side, attr in (("encoder", "self_attn"), ("decoder", "self_attn"), ("decoder", "encoder_attn")):
        projections = [getattr(layer, attr).v_proj for layer in getattr(model, side).layers]
        raw, mixed = [], []

        def record(m, i, o, raw=raw, mixed=mixed):
            raw.append(m.weight @ i[0].unsqueeze(-1))
            mixed.append(o)

        hooks = [p.register_forward_hook(record) for p in projections]
        with torch.no_grad():
            model(*random_batch(model))
        for h in hooks:
            h.remove()
        v1 = raw[0].squeeze(-1) + projections[0].bias
        for n in range(1, len(projections)):
            vn = raw[n].squeeze(-1) + projections[n].bias
            torch.testing.assert_close(mixed[n], 0.5 * v1 + 0.5 * vn)
        torch.testing.assert_close(mixed[0], v1)
        assert not projections[0].store  # V_1 is not kept after the forward pass
    # nor after beam search, which calls the encoder's and decoder's forward directly (no hooks run)
    src, lengths, _ = random_batch(model)
    generator = SequenceGenerator([model], model.decoder.dictionary, beam_size=2, max_len_a=0, max_len_b=4)
    with torch.no_grad():
        generator.generate([model], {"net_input": {"src_tokens": src, "src_lengths": lengths}})
    stores = {id(getattr(layer, attr).v_proj.store) for side, attr in (("encoder", "self_attn"), ("decoder", "self_attn"))
              for layer in getattr(model, side).layers}  # fmt: skip
    assert len(stores) == 2 and all(not getattr(layer, attr).v_proj.store for side, attr in
                                    (("encoder", "self_attn"), ("decoder", "self_attn"), ("decoder", "encoder_attn"))
                                    for layer in getattr(model, side).layers)  # fmt: skip


@pytest.mark.parametrize(("extra", "message"), [
    (["--tying", "value"], "--value-residual both cannot be combined with --tying value: "),
    (["--residual", "hybrid"], "--value-residual both cannot be combined with --residual hybrid: "),
    (["--value-residual-mode", "token", "--value-residual-cross"], "--value-residual-cross cannot be used with"),
    (["--encoder-layerdrop", "0.5"], "--encoder-layerdrop cannot be used with --value-residual both: "),
    (["--decoder-layerdrop", "0.5"], "--decoder-layerdrop cannot be used with --value-residual both: "),
])  # fmt: skip
def test_value_residual_refusals(extra, message):
    with pytest.raises(PluginOptionError, match=message):
        build_model("value_residual_e6d6", [*SHAPE, *extra])
    with pytest.raises(PluginOptionError, match="--value-residual-cross needs"):
        build_model("residual_axes", [*SHAPE, "--value-residual-cross"])


@pytest.mark.parametrize(("family", "atol", "extra"), [
    ("mhc", 1e-4, ["--mhc-bias-init", "preln"]), ("mhc_lite", 1e-4, ["--mhc-bias-init", "preln"]),
    ("mhc", 1e-4, ["--mhc-bias-init", "mixed"]), ("mhc_lite", 1e-4, ["--mhc-bias-init", "mixed"]),
    ("frac", 0, []), ("mudd", 0, []),
])  # fmt: skip
def test_stream_models_are_the_pre_ln_model_at_init(family, atol, extra):
    """On the Pre-LN model's weights (the layers keep its parameter names; the new parameters at their init),
    frac-connections (eq. 15) and MUDD (current_only) compute the Pre-LN model exactly, mHC with its preln bias
    init up to LayerNorm's eps on the 1.54x branch input (every stream equals the Pre-LN state); with the mixed
    init too, whose doubly stochastic H_res = SK(exp I) maps equal streams to themselves."""
    pre = build_model("transformer_preln_e6d6", SHAPE, seed=3)
    model = build_model(f"{family}_e6d6", [*SHAPE, *extra], seed=4)
    result = model.load_state_dict(pre.state_dict(), strict=False)
    assert not result.unexpected_keys
    new = (".hc.", "hc_version", ".mudd.", "key_layer_norm", "value_layer_norm")
    assert all(any(part in k for part in new) for k in result.missing_keys), result.missing_keys
    batch = random_batch(model)
    with torch.no_grad():
        torch.testing.assert_close(model(*batch)[0], pre(*batch)[0], rtol=0, atol=atol)


@pytest.mark.parametrize("family", ["attnres", "attnres_block"])
def test_attnres_reads_the_uniform_average_of_its_sources_at_init(family):
    """Every pseudo-query w_l = 0 (section 5): every sublayer input and the stack output are the plain mean of
    the sources (the embedding and the earlier outputs or block sums), in float64."""
    model = build_model(f"{family}_e6d6", SHAPE).double()
    reads = []
    for side in (model.encoder, model.decoder):
        ar = side.attn_res
        assert not ar.queries.any()
        original = ar.read

        def read(index, state, original=original):
            sources = [*state.blocks, *([state.partial] if state.partial is not None else [])]
            out = original(index, state)
            reads.append((out, torch.stack(sources).mean(0)))
            return out

        ar.read = read
    with torch.no_grad():
        model(*random_batch(model))
    assert len(reads) == (4 * 2 + 1) + (4 * 3 + 1)
    for out, mean in reads:
        torch.testing.assert_close(out, mean)


@pytest.mark.parametrize("family", ["attnres", "attnres_block", "mudd"])
@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_aggregating_over_no_layers_is_refused_by_the_layers_option(family, side):
    choice = family.replace("_", "-")
    with pytest.raises(PluginOptionError, match=f"--{side}-layers must be at least 1 with --depth-aggregation {choice}, got 0"):
        build_model(f"{family}_e6d6", [*SHAPE, f"--{side}-layers", "0"])


def test_attnres_block_size_errors():
    with pytest.raises(PluginOptionError, match="--attnres-block-size must be 1 with --depth-aggregation attnres"):
        build_model("attnres_e6d6", [*SHAPE, "--attnres-block-size", "2"])
    model = build_model("attnres_block_e6d6", [*SHAPE, "--attnres-block-size", "3"])
    assert model.decoder.attn_res.block_size == 3


def test_mhc_lite_rate_is_limited(capsys):
    with pytest.raises(PluginOptionError, match=r"--mhc-rate must be in \[1, 5\] with --depth-aggregation mhc-lite"):
        build_model("mhc_lite_e6d6", [*SHAPE, "--mhc-rate", "6"])


def test_presets_set_the_new_axes():
    assert parse_model_args("ortho_e12d12").residual == "orthogonal"
    args = parse_model_args("derf_iwslt_e36d6", tiny=False)
    assert (args.norm, args.residual, args.encoder_layers, args.encoder_embed_dim) == ("derf", "pre", 36, 256)


# ------------------------------------------------------------------ issue 55: the authors' defaults


def _rztx_layers(model, x, enc):
    """The authors' RZTXEncoderLayer and RZTXDecoderLayer forward (majumderb/rezero rztx.py), written out in float64
    on the layers' own attention and FFN weights: ONE resweight a per layer for all its sublayers, no norm:
    x + a SA(x), then + a FFN; the decoder x + a SA(x), + a CA(x, memory), + a FFN."""
    t = x.shape[0]
    causal = torch.triu(torch.full((t, t), float("-inf"), dtype=torch.float64), 1)
    ffn = lambda layer, h: layer.fc2(torch.relu(layer.fc1(h)))
    layer = model.encoder.layers[0]
    a = layer.site_update["layer"].alpha
    h = x + a * layer.self_attn(query=x, key=x, value=x, key_padding_mask=None, need_weights=False)[0]
    encoder_layer = h + a * ffn(layer, h)
    layer = model.decoder.layers[0]
    a = layer.site_update["layer"].alpha
    h = x + a * layer.self_attn(query=x, key=x, value=x, attn_mask=causal, need_weights=False)[0]
    h = h + a * layer.encoder_attn(query=h, key=enc, value=enc, key_padding_mask=None, static_kv=True, need_weights=False)[0]
    return encoder_layer, h + a * ffn(layer, h), causal


def test_rezero_is_the_authors_form_one_gate_per_layer_and_no_final_norm():
    """Default since issue 55: one alpha per layer shared by its 2 (encoder) or 3 (decoder) sublayers, as rztx.py,
    and no stack-final LayerNorm (its README: nn.TransformerEncoder/Decoder's norm left None); each layer is the
    rztx.py layer in float64; at init (alpha = 0) every layer is still the identity."""
    model = build_model("rezero_e6d6", SHAPE).double()
    gates = [m for m in model.modules() if isinstance(m, ReZeroGate)]
    assert len(gates) == 4 + 4 and {tuple(layer.site_update) for side in (model.encoder, model.decoder)
                                    for layer in side.layers} == {("layer",)}  # fmt: skip
    assert model.encoder.layer_norm is None and model.decoder.layer_norm is None
    assert not [n for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    with torch.no_grad():
        for i, gate in enumerate(gates):
            gate.alpha.fill_(0.1 * (i + 1))
        x, enc = (torch.randn(5, 2, 16, dtype=torch.float64) for _ in range(2))
        encoder_layer, decoder_layer, causal = _rztx_layers(model, x, enc)
        torch.testing.assert_close(model.encoder.layers[0](x, None), encoder_layer)
        got = model.decoder.layers[0](x, encoder_out=enc, encoder_padding_mask=None, self_attn_mask=causal)[0]
        torch.testing.assert_close(got, decoder_layer)
        # the stacks end on their last layer's output: no final norm
        src, lengths, prev = random_batch(model)
        last = {}
        hooks = [getattr(model, side).layers[-1].register_forward_hook(
            lambda m, i, o, side=side: last.__setitem__(side, o[0] if isinstance(o, tuple) else o))
            for side in ("encoder", "decoder")]  # fmt: skip
        encoder_out = model.encoder(src, src_lengths=lengths)
        features, _ = model.decoder.extract_features(prev, encoder_out=encoder_out)
        for h in hooks:
            h.remove()
        torch.testing.assert_close(encoder_out["encoder_out"][0], last["encoder"], rtol=0, atol=0)
        torch.testing.assert_close(features, last["decoder"].transpose(0, 1), rtol=0, atol=0)
    fresh = build_model("rezero_e6d6", SHAPE)
    for x_in, x_out in _layer_io(fresh, random_batch(fresh)):
        torch.testing.assert_close(x_out, x_in, rtol=0, atol=0)


def test_rezero_keeps_its_earlier_form_as_options():
    """--rezero-gate sublayer --rezero-final-norm: one alpha per sublayer and fairseq's final LayerNorms (the
    plugin's form before issue 55)."""
    model = build_model("rezero_e6d6", [*SHAPE, "--rezero-gate", "sublayer", "--rezero-final-norm"])
    assert [tuple(layer.site_update) for layer in model.decoder.layers] == [("self_attn", "encoder_attn", "ffn")] * 4
    assert isinstance(model.encoder.layer_norm, nn.LayerNorm) and isinstance(model.decoder.layer_norm, nn.LayerNorm)
    model = build_model("rezero_e6d6", [*SHAPE, "--rezero-final-norm", "false"])
    assert model.encoder.layer_norm is None
    with pytest.raises(PluginOptionError, match="--rezero-gate applies only with --residual rezero"):
        build_model("residual_axes", [*SHAPE, "--rezero-gate", "layer"])


def test_mhc_starts_at_the_authors_codes_values():
    """Default since issue 55 (--mhc-bias-init mhc_lite): each unit's static logits are mhc-lite's (b_pre = b_post
    = +1 on stream k mod n, -1 elsewhere; b_res 0 / -8), so H_post is 1.46 / 0.54; --mhc-bias-init preln keeps
    H_post = 1 (the Pre-LN model)."""
    for family, res in (("mhc", "sinkhorn"), ("mhc_lite", "permutations")):
        assert parse_model_args(f"{family}_e6d6").mhc_bias_init == "mhc_lite"
        for extra, post_equals_pre in (([], True), (["--mhc-bias-init", "preln"], False)):
            units = [m for m in build_model(f"{family}_e6d6", [*SHAPE, *extra]).modules()
                     if isinstance(m, ManifoldHyperConnection)]  # fmt: skip
            assert len(units) == 4 * 2 + 4 * 3
            for unit in units:
                assert unit.residual == res
                b_pre, b_post = unit.bias.detach()[:4], unit.bias.detach()[4:8]
                assert sorted(b_pre.tolist()) == [-1.0, -1.0, -1.0, 1.0]
                assert torch.equal(b_post, b_pre if post_equals_pre else torch.zeros(4))


def test_derf_alpha_init_follows_the_task():
    """Derf's alpha_0: 1.0 for a language model (the authors' GPT-2 patch), 0.5 for translation (their value for
    every other task); --derf-alpha-init sets it."""
    assert parse_lm_args("unused-data-dir", "derf_lm_d6").derf_alpha_init == 1.0
    assert parse_model_args("derf_e6d6").derf_alpha_init == 0.5
    norms = [m for m in build_model("derf_e6d6", [*SHAPE, "--derf-alpha-init", "0.8"]).modules() if isinstance(m, DynamicErf)]
    assert len(norms) == 4 * 2 + 4 * 3 + 2 and all(m.alpha.item() == pytest.approx(0.8) for m in norms)
    x = torch.randn(3, 16, dtype=torch.float64)
    norm = DynamicErf(16, alpha_init=1.0).double()
    with torch.no_grad():  # the patch's Dynamic_erf: weight * erf(alpha x + shift) + bias
        torch.testing.assert_close(norm(x), norm.weight * torch.erf(1.0 * x + 0.0) + norm.bias)
    with pytest.raises(PluginOptionError, match="--derf-alpha-init applies only with --norm derf"):
        build_model("residual_axes", [*SHAPE, "--derf-alpha-init", "1"])


# the options issue 55 added or changed, and the old form a checkpoint saved before then must be rebuilt with
BEFORE_55 = {
    "rezero": (("rezero_gate", "rezero_final_norm"), ["--rezero-gate", "sublayer", "--rezero-final-norm"]),
    "mhc": (("mhc_bias_init",), ["--mhc-bias-init", "preln"]),
    "mhc_lite": (("mhc_bias_init",), ["--mhc-bias-init", "preln"]),
}


@pytest.mark.parametrize("family", sorted(BEFORE_55))
def test_a_checkpoint_saved_before_issue_55_rebuilds_its_old_form(family, tmp_path):
    """fairseq rebuilds a checkpoint's model from its stored args, which (saved before issue 55) lack the new
    options: the loaded model is the old form and the old weights load strictly; a fresh command line builds the
    new form, into which those weights do not load."""
    names, old_flags = BEFORE_55[family]
    arch = f"{family}_e6d6"
    old = build_model(arch, [*SHAPE, *old_flags], seed=1)
    args = parse_model_args(arch, SHAPE)
    for name in names:
        delattr(args, name)  # what the code before issue 55 stored
    state = checkpoint_utils.load_checkpoint_to_cpu(str(save_checkpoint(old, args, tmp_path / "old.pt")))
    stored = state["cfg"]["model"]
    assert getattr(stored, STORED_ARGS, None) is not None and not any(hasattr(stored, n) for n in names)
    loaded = ARCH_MODEL_REGISTRY[stored.arch].build_model(stored, TinyTask()).eval()
    assert {n: getattr(stored, n) for n in names} == {n: getattr(parse_model_args(arch, old_flags), n) for n in names}
    loaded.load_state_dict(state["model"])
    batch = random_batch(old)
    with torch.no_grad():
        torch.testing.assert_close(loaded(*batch)[0], old(*batch)[0], rtol=0, atol=0)
    fresh = parse_model_args(arch, SHAPE)
    new = ARCH_MODEL_REGISTRY[arch].build_model(fresh, TinyTask())
    assert {n: getattr(fresh, n) for n in names} != {n: getattr(stored, n) for n in names}
    if family == "rezero":  # a different module structure: the old weights do not fit
        with pytest.raises(RuntimeError, match="Missing key|Unexpected key"):
            new.load_state_dict(state["model"])
    # saved since: the filled value is stored, and wins
    state = checkpoint_utils.load_checkpoint_to_cpu(str(save_checkpoint(new, fresh, tmp_path / "new.pt")))
    ARCH_MODEL_REGISTRY[arch].build_model(state["cfg"]["model"], TinyTask()).load_state_dict(state["model"])


def test_a_derf_language_model_saved_before_issue_55_keeps_alpha_half():
    """A Derf LM's stored args lack --derf-alpha-init: the LM's architecture fills 0.5, the value of the code that
    trained it; a fresh command line, 1.0."""
    args = parse_lm_args("unused-data-dir", "derf_lm_d6")
    del args.derf_alpha_init
    setattr(args, STORED_ARGS, [])  # as checkpoint_safety marks a loaded checkpoint's model args
    ARCH_CONFIG_REGISTRY[args.arch](args)
    assert args.derf_alpha_init == 0.5
    assert parse_lm_args("unused-data-dir", "derf_lm_d6").derf_alpha_init == 1.0
