"""DeepNet, T-Fixup, B2T, NormFormer and Admin: each model's forward against its paper's equations written
out directly in float64, the initialization statistics of the methods that are initializations, Admin's
profiling pass (its recursion, idempotence, checkpoint), incremental decoding, option errors, and one
fairseq-train + fairseq-generate run."""

import copy
import io
import math

import pytest
import torch
from torch import nn

from fairseq_plugins.models.families import ALIASES
from fairseq_plugins.modules import residual_wiring as rw
from fairseq_plugins.validation import PluginOptionError

from .equations import attention, ffn
from .equations import layer_norm as ln
from .forkserver import run_forked
from .helpers import (
    TinyTask,
    build_model,
    full_and_incremental_logits,
    generate_command,
    hypotheses,
    parameter_gradients,
    parse_model_args,
    random_batch,
    train_command,
)

# ---------------------------------------------------------------------------------------------------
# the equations, written out


def post_ln_layer(x, sublayers, skip_scales, bottom_to_top=False):
    """x <- LN(w_i * x + F_i(x)) for each sublayer (F_i, LN_i), w_i a scalar or d-vector; B2T adds the
    layer input to the last sum; an LN of None is the identity (T-Fixup)."""
    layer_input = x
    for i, ((f, norm), w) in enumerate(zip(sublayers, skip_scales, strict=True)):
        total = w * x + f(x)
        if bottom_to_top and i == len(sublayers) - 1:
            total = total + layer_input
        x = ln(total, norm) if norm is not None else total
    return x


def family_layers(family, layer, pad, memory=None, src_pad=None):
    """The (F_i, LN_i) pairs and skip scales of one Post-LN layer, encoder if memory is None."""
    decoder = memory is not None
    sub = [(lambda x: attention(x, x, x, layer.self_attn, None if decoder else pad, causal=decoder),
            layer.self_attn_layer_norm)]  # fmt: skip
    if decoder:
        sub.append((lambda x: attention(x, memory, memory, layer.encoder_attn, src_pad), layer.encoder_attn_layer_norm))
    sub.append((lambda x: ffn(x, layer), layer.final_layer_norm))
    if family == "tfixup":
        sub = [(f, None) for f, _ in sub]
    if family == "deepnet":
        scales = [layer.alpha] * len(sub)
    elif family == "admin":
        scales = list(layer.omega_init + layer.omega_delta)
    else:
        scales = [1.0] * len(sub)
    return sub, scales


def normformer_encoder_layer(x, layer, pad):
    """x <- x + LN_a(HeadScaleMHA(LN(x))); x <- lambda x + fc2(LN_f(relu(fc1(LN(x)))))."""
    out_proj = layer.self_attn.out_proj
    a = attention(*[ln(x, layer.self_attn_layer_norm)] * 3, layer.self_attn, pad, head_scale=out_proj.head_scale)
    x = x + ln(a, out_proj.attn_ln)
    lam = layer.w_resid if layer.w_resid is not None else 1.0
    return lam * x + ffn(ln(x, layer.final_layer_norm), layer, layer.fc2.ffn_layernorm)


def normformer_decoder_layer(x, layer, memory, src_pad, impl):
    h = ln(x, layer.self_attn_layer_norm)
    if impl == "paper":
        a = attention(h, h, h, layer.self_attn, causal=True, head_scale=layer.self_attn.out_proj.head_scale)
    else:
        a = attention(h, h, h, layer.self_attn, causal=True, chunk_scale=layer.c_attn)
    x = x + ln(a, layer.attn_ln)
    x = x + attention(ln(x, layer.encoder_attn_layer_norm), memory, memory, layer.encoder_attn, src_pad)
    lam = layer.w_resid if layer.w_resid is not None else 1.0
    return lam * x + ffn(ln(x, layer.final_layer_norm), layer, layer.ffn_layernorm)


def pre_ln_encoder_layer(x, layer, pad):
    h = ln(x, layer.self_attn_layer_norm)
    x = x + attention(h, h, h, layer.self_attn, pad)
    return x + ffn(ln(x, layer.final_layer_norm), layer)


def reference_forward(family, model, src, prev, impl="paper"):
    src_pad = src.eq(model.encoder.padding_idx)
    x, _ = model.encoder.forward_embedding(src)  # scaled, position-embedded embedding (dropout off)
    x = x.masked_fill(src_pad.unsqueeze(-1), 0).transpose(0, 1)
    for layer in model.encoder.layers:
        if family == "normformer":
            x = (normformer_encoder_layer if impl == "paper" else pre_ln_encoder_layer)(x, layer, src_pad)
        else:
            x = post_ln_layer(x, *family_layers(family, layer, src_pad), bottom_to_top=family == "b2t")
    if model.encoder.layer_norm is not None:
        x = ln(x, model.encoder.layer_norm)
    memory = x

    d = model.decoder
    y = (d.embed_scale * d.embed_tokens(prev) + d.embed_positions(prev)).transpose(0, 1)
    for layer in d.layers:
        if family == "normformer":
            y = normformer_decoder_layer(y, layer, memory, src_pad, impl)
        else:
            sub, scales = family_layers(family, layer, None, memory, src_pad)
            y = post_ln_layer(y, sub, scales, bottom_to_top=family == "b2t")
    if d.layer_norm is not None:
        y = ln(y, d.layer_norm)
    return y.transpose(0, 1)


EQUATION_CASES = {
    "deepnet": [],
    "tfixup": [],
    "b2t": [],
    "admin": [],
    "normformer": ["--scale-resids"],
    "normformer-fairseq": ["--normformer-impl", "fairseq", "--scale-resids"],
}


@pytest.mark.parametrize("case", sorted(EQUATION_CASES))
def test_forward_matches_the_equations(case):
    family, _, impl = case.partition("-")
    model = build_model(f"{family}_e6d6", ["--encoder-layers", "3", "--decoder-layers", "2",
                                           *EQUATION_CASES[case]]).double()  # fmt: skip
    src, lengths, prev = random_batch(model, batch=3, src_len=6, tgt_len=5)
    with torch.no_grad():
        # move every scale, LayerNorm and omega off its initial value, so each term is exercised
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        if family == "admin":
            for layer in [*model.encoder.layers, *model.decoder.layers]:
                layer.omega_init.uniform_(0.5, 3.0, generator=g)
        features, _ = model(src, lengths, prev, features_only=True)
        expected = reference_forward(family, model, src, prev, impl or "paper")
    # fairseq's attention takes its softmax in float32 (utils.softmax), hence not 1e-12
    torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------------
# initialization


def std(tensors) -> float:
    return torch.cat([t.detach().flatten() for t in tensors]).std().item()


def xavier_std(linear, gain=1.0) -> float:
    return gain * math.sqrt(2.0 / (linear.in_features + linear.out_features))


def assert_std(tensors, expected, rel=0.03):
    assert std(tensors) == pytest.approx(expected, rel=rel)


def build_wide(arch, extra=()):
    """The real IWSLT width (256/1024, 4 heads): enough weights for 3% statistics."""
    return build_model(arch, list(extra), tiny=False)


def test_deepnet_constants_match_the_papers_table():
    for (n, m), expected in {(6, 6): (1.4179, 0.4970, 2.0598, 0.3433),
                             (12, 12): (1.7609, 0.4002, 2.4495, 0.2887),
                             (18, 18): (1.9987, 0.3526, 2.7108, 0.2608)}.items():  # fmt: skip
        c = rw.deepnet_constants(n, m)
        got = (c["encoder_alpha"], c["encoder_beta"], c["decoder_alpha"], c["decoder_beta"])
        assert got == pytest.approx(expected, abs=1e-4)


def test_deepnet_paper_init_statistics():
    model = build_wide("deepnet_iwslt_e12d6")
    c = rw.deepnet_constants(12, 6)
    assert model.encoder.layers[0].alpha == c["encoder_alpha"] and model.decoder.layers[0].alpha == c["decoder_alpha"]
    for side in ("encoder", "decoder"):
        layers, beta = getattr(model, side).layers, c[f"{side}_beta"]
        for name in ("fc1", "fc2"):
            assert_std([getattr(layer, name).weight for layer in layers], xavier_std(getattr(layers[0], name), beta))
        for attn_name in ("self_attn", "encoder_attn") if side == "decoder" else ("self_attn",):
            attns = [getattr(layer, attn_name) for layer in layers]
            for proj, gain in (("q_proj", 1.0), ("k_proj", 1.0), ("v_proj", beta), ("out_proj", beta)):
                assert_std([getattr(a, proj).weight for a in attns], xavier_std(getattr(attns[0], proj), gain))


def test_deepnet_torchscale_init_statistics():
    model = build_wide("deepnet_iwslt_e12d6", ["--deepnet-init", "torchscale"])
    scales = rw.torchscale_init_scales(12, 6)
    assert scales["encoder"] == pytest.approx(0.87 / 1.15 / rw.deepnet_constants(12, 6)["encoder_beta"])
    for side in ("encoder", "decoder"):
        layers = getattr(model, side).layers
        default = 1 / math.sqrt(3 * 256)  # PyTorch's kaiming_uniform(a=sqrt 5): U(+-1/sqrt(fan_in))
        assert_std([layer.fc1.weight for layer in layers], default / scales[side])
        assert_std([layer.fc2.weight for layer in layers], 1 / math.sqrt(3 * 1024) / scales[side])
        assert_std([layer.self_attn.v_proj.weight for layer in layers], default / scales[side])
        assert_std([layer.self_attn.q_proj.weight for layer in layers], default)


@pytest.mark.parametrize("decoder_depth", ["encoder", "decoder"])
def test_tfixup_init_statistics_and_no_layer_norm(decoder_depth):
    model = build_wide("tfixup_iwslt_e12d6", ["--tfixup-decoder-depth", decoder_depth])
    n, m = 12, (6 if decoder_depth == "decoder" else 12)
    assert not [name for name, mod in model.named_modules() if isinstance(mod, nn.LayerNorm)]
    enc, dec = model.encoder.layers, model.decoder.layers
    for layers, scale in ((enc, 0.67 * n**-0.25), (dec, (9 * m) ** -0.25)):
        attns = [a for layer in layers for a in rw.attentions(layer)]
        assert_std([layer.fc1.weight for layer in layers], xavier_std(layers[0].fc1, scale))
        assert_std([layer.fc2.weight for layer in layers], xavier_std(layers[0].fc2, scale))
        assert_std([a.v_proj.weight for a in attns], xavier_std(attns[0].v_proj, scale))
        assert_std([a.out_proj.weight for a in attns], xavier_std(attns[0].out_proj, scale))
        assert_std([a.q_proj.weight for a in attns], xavier_std(attns[0].q_proj))  # Xavier, gain 1
        assert all(float(layer.fc1.bias.detach().abs().max()) == 0 for layer in layers)
    pad = model.encoder.padding_idx
    for embed, depth in ((model.encoder.embed_tokens, n), (model.decoder.embed_tokens, m)):
        rows = torch.cat([embed.weight[:pad], embed.weight[pad + 1 :]])
        assert_std([rows], 256**-0.5 * (9 * depth) ** -0.25, rel=0.1)  # a small table: 10%


def test_tfixup_shared_embeddings_are_scaled_once():
    model = build_model("tfixup_e6d6", ["--share-all-embeddings", "--tfixup-decoder-depth", "decoder",
                                        "--encoder-layers", "8"])  # fmt: skip
    plain = build_model("transformer_postln_e6d6", ["--share-all-embeddings", "--encoder-layers", "8"])
    assert model.decoder.embed_tokens.weight is model.encoder.embed_tokens.weight
    torch.testing.assert_close(model.encoder.embed_tokens.weight, plain.encoder.embed_tokens.weight * 72**-0.25)


@pytest.mark.parametrize("b2t_init", ["rescaled", "default"])
def test_b2t_init_is_post_ln_init_times_inverse_sqrt_depth(b2t_init):
    args = ["--encoder-layers", "4", "--decoder-layers", "3"]
    b2t = build_model("b2t_e6d6", [*args, "--b2t-init", b2t_init], seed=5).state_dict()
    post = build_model("transformer_postln_e6d6", args, seed=5).state_dict()
    assert b2t.keys() == post.keys()
    for key, value in post.items():
        depth = 4 if key.startswith("encoder.layers.") else 3
        rescaled = ".layers." in key and "weight" in key and "layer_norm" not in key and b2t_init == "rescaled"
        torch.testing.assert_close(b2t[key], value * depth**-0.5 if rescaled else value, msg=key)


def test_normformer_starts_with_unit_scales_and_plain_layer_norms():
    model = build_model("normformer_e6d6", ["--scale-resids"])
    for name, p in model.named_parameters():
        if name.endswith(("head_scale", "w_resid")) or ("attn_ln" in name or "ffn_layernorm" in name) and name.endswith("weight"):
            assert torch.equal(p, torch.ones_like(p)), name
        elif "attn_ln" in name or "ffn_layernorm" in name:
            assert torch.equal(p, torch.zeros_like(p)), name
    enc, dec = model.encoder.layers[0], model.decoder.layers[0]
    assert enc.fc2.ffn_layernorm.weight.numel() == 32 and dec.ffn_layernorm.weight.numel() == 32
    assert dec.c_attn is None  # fairseq's post-W_O head scale is off in the paper implementation
    fairseq_impl = build_model("normformer_e6d6", ["--normformer-impl", "fairseq"])
    assert fairseq_impl.decoder.layers[0].c_attn is not None
    assert not any("head_scale" in n or "w_resid" in n for n, _ in fairseq_impl.encoder.named_parameters())


# ---------------------------------------------------------------------------------------------------
# Admin's profiling


def record_sums(model):
    """Patch every layer's ``combine`` to record (site, skip input, branch output) per stack."""
    records = {"encoder": [], "decoder": []}
    for side, stack in records.items():
        for layer in getattr(model, side).layers:
            original = layer.combine

            def combine(site, x, residual, original=original, stack=stack):
                stack.append((residual.detach().clone(), x.detach().clone()))
                return original(site, x, residual)

            layer.combine = combine
    return records


def test_admin_profiling_follows_the_authors_recursion():
    model = build_wide("admin_iwslt_e6d6", ["--dropout", "0", "--encoder-layers", "4", "--decoder-layers", "3"])
    model.train()
    records = record_sums(model)
    src, lengths, prev = random_batch(model, batch=4, src_len=9, tgt_len=7)
    model(src, lengths, prev)  # profiling pass, then the real forward
    assert bool(model.admin_profiled)
    for side, n_sites in (("encoder", 8), ("decoder", 9)):
        sums = records[side][:n_sites]  # the profiling pass's sums
        omegas = [o for layer in getattr(model, side).layers for o in layer.omega_init]
        assert len(omegas) == n_sites
        r = 1.0
        for (residual, branch), omega in zip(sums, omegas, strict=True):
            torch.testing.assert_close(omega, torch.full_like(omega, r))
            r = math.sqrt(residual.double().mul(r).var(correction=0).item() + branch.double().var(correction=0).item())
        # the second forward of that batch used the same omegas: the same sums
        for (a, b), (c, d) in zip(sums, records[side][n_sites:], strict=True):
            torch.testing.assert_close((a, b), (c, d))
    assert float(model.encoder.layers[-1].omega_init.min()) > 1.5  # the skip grows with depth


def test_admin_profiles_once_and_the_checkpoint_keeps_it():
    model = build_model("admin_e6d6", ["--dropout", "0.1"])
    batch = random_batch(model)
    model.eval()
    model(*batch)
    assert not bool(model.admin_profiled), "evaluation must not profile"
    model.train()
    model(*batch)
    omegas = [layer.omega_init.clone() for layer in model.encoder.layers]
    model(*random_batch(model, seed=3))
    assert all(torch.equal(a, layer.omega_init) for a, layer in zip(omegas, model.encoder.layers, strict=True))

    buffer = io.BytesIO()
    torch.save({"model": model.state_dict()}, buffer)
    buffer.seek(0)
    fresh = build_model("admin_e6d6", ["--dropout", "0.1"], seed=1).train()
    fresh.load_state_dict(torch.load(buffer, weights_only=True)["model"], strict=True)
    fresh(*random_batch(fresh, seed=4))  # a resumed run does not profile again
    assert all(torch.equal(a, layer.omega_init) for a, layer in zip(omegas, fresh.encoder.layers, strict=True))


def test_admin_fc_init_is_xavier_with_zero_bias():
    model = build_wide("admin_iwslt_e6d6")
    layers = [*model.encoder.layers, *model.decoder.layers]
    assert_std([layer.fc1.weight for layer in layers], xavier_std(layers[0].fc1))
    assert all(float(layer.fc2.bias.detach().abs().max()) == 0 for layer in layers)
    assert all(float(layer.omega_delta.detach().abs().max()) == 0 for layer in layers)


# ---------------------------------------------------------------------------------------------------
# decoding, options, command line

VARIANTS = [
    ("deepnet_e12d6", ["--deepnet-init", "torchscale"]),
    ("tfixup_e12d6", ["--tfixup-decoder-depth", "decoder"]),
    ("b2t_e12d6", []),
    ("normformer_e12d6", ["--scale-resids"]),
    ("normformer_e12d6", ["--normformer-impl", "fairseq", "--scale-resids"]),
    ("admin_e12d6", []),
]


@pytest.mark.parametrize(("arch", "extra"), VARIANTS, ids=[f"{a}{''.join(e)}" for a, e in VARIANTS])
def test_incremental_equals_full(arch, extra):
    model = build_model(arch, extra).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0), dtype=p.dtype))
    full, incremental = full_and_incremental_logits(model, *random_batch(model))
    torch.testing.assert_close(incremental, full, rtol=1e-5, atol=1e-5)


def test_admin_profiles_under_activation_checkpointing_with_the_same_gradients():
    grads = []
    for extra in ([], ["--checkpoint-activations"]):
        model = build_model("admin_e6d6", extra, seed=3).train()
        torch.manual_seed(0)  # same dropout masks in both runs
        grads.append(parameter_gradients(model, random_batch(model)))
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, msg=name)


@pytest.mark.parametrize(("arch", "option", "bad"), [
    ("deepnet_e6d6", "--deepnet-init", "xavier"),
    ("tfixup_e6d6", "--tfixup-decoder-depth", "both"),
    ("b2t_e6d6", "--b2t-init", "none"),
    ("normformer_e6d6", "--normformer-impl", "torchscale"),
    ("normformer_e6d6", "--scale-heads", "maybe"),
])  # fmt: skip
def test_bad_option_is_rejected_at_parse_time(arch, option, bad, capsys):
    with pytest.raises(SystemExit):
        parse_model_args(arch, [option, bad])
    err = capsys.readouterr().err
    assert option in err and repr(bad) in err


@pytest.mark.parametrize(("arch", "flag", "message"), [
    ("deepnet_e6d6", "--encoder-normalize-before", "--encoder-normalize-before cannot be used with deepnet"),
    ("tfixup_e6d6", "--decoder-normalize-before", "--decoder-normalize-before cannot be used with tfixup"),
    ("tfixup_e6d6", "--layernorm-embedding", "--layernorm-embedding cannot be used with tfixup"),
    ("b2t_e6d6", "--encoder-normalize-before", r"cannot be used with b2t_transformer \(--residual b2t\): its layers are Post-LN"),
    ("admin_e6d6", "--decoder-normalize-before", "cannot be used with admin"),
])  # fmt: skip
def test_contradicting_layer_norm_options_are_rejected(arch, flag, message):
    with pytest.raises(PluginOptionError, match=message):
        build_model(arch, [flag])


def test_normformer_needs_pre_ln_and_checks_its_flags_in_build_model():
    args = parse_model_args("normformer_e6d6")
    args.encoder_normalize_before = False
    with pytest.raises(PluginOptionError, match="--encoder-normalize-before must be set with normformer"):
        ALIASES["normformer_transformer"].build_model(args, TinyTask())
    args = parse_model_args("normformer_e6d6")
    args.scale_fc = "sometimes"
    with pytest.raises(PluginOptionError, match="--scale-fc must be true or false"):
        ALIASES["normformer_transformer"].build_model(args, TinyTask())


def test_normformer_flags_can_be_switched_off():
    model = build_model("normformer_e6d6", ["--scale-heads", "false", "--scale-attn", "no"])
    names = [n for n, _ in model.named_parameters()]
    assert not any("head_scale" in n or "attn_ln" in n for n in names)
    assert any("ffn_layernorm" in n for n in names)


def test_admin_trains_in_fp16_and_translates_from_the_command_line(corpus_bin, tmp_path):
    """fairseq-train profiles on its first batch and saves the omegas; fairseq-generate uses them.
    In half precision fairseq's FP16Optimizer copies the parameters to float32 before that batch; the
    profiled omegas live in a buffer, so its first step cannot put the stale (all-ones) values back. Each command a
    process of its own, forked from tests/forkserver.py's server (generate reads only the checkpoint)."""
    extra = ["--fp16", "--fp16-no-flatten-grads"]
    run_forked(train_command(corpus_bin, tmp_path, "admin_e6d6", max_update=3, extra=extra))
    state = torch.load(tmp_path / "checkpoint_last.pt")["model"]
    omega = state["encoder.layers.5.omega_init"].float() + state["encoder.layers.5.omega_delta"].float()
    assert bool(state["admin_profiled"]) and float(omega.min()) > 1.0
    proc = run_forked(generate_command(corpus_bin, tmp_path / "checkpoint_last.pt"))
    assert len(hypotheses(proc.stdout)) == 21


# ------------------------------------------------------------------------------ issue 26, item 6: the defaults


def test_deepnet_torchscale_divides_biases_too():
    """torchscale divides every parameter of fc1/fc2/v_proj/out_proj, biases included, by init_scale."""
    layer_args = ["--encoder-layers", "2", "--decoder-layers", "2"]
    model = build_model("deepnet_e6d6", [*layer_args, "--deepnet-init", "torchscale"], seed=4)
    layer = model.encoder.layers[0]
    scale = rw.torchscale_init_scales(2, 2)["encoder"]
    # the same init on a copy, without the division: every divided tensor is exactly the undivided one / scale
    undivided = copy.deepcopy(layer)
    torch.manual_seed(11)
    rw.torchscale_init_(layer, scale)
    torch.manual_seed(11)
    rw.torchscale_init_(undivided, 1.0)
    for name in ("fc1", "fc2"):
        torch.testing.assert_close(getattr(layer, name).bias * scale, getattr(undivided, name).bias)
        torch.testing.assert_close(getattr(layer, name).weight * scale, getattr(undivided, name).weight)
    for proj in ("v_proj", "out_proj"):
        torch.testing.assert_close(getattr(layer.self_attn, proj).bias * scale, getattr(undivided.self_attn, proj).bias)
    for proj in ("q_proj", "k_proj"):
        torch.testing.assert_close(getattr(layer.self_attn, proj).bias, getattr(undivided.self_attn, proj).bias)


def test_tfixup_decoder_scale_uses_the_decoder_depth_by_default():
    args = parse_model_args("tfixup_e12d6")
    assert args.tfixup_decoder_depth == "decoder"
    assert rw.tfixup_scales(12, 6, args.tfixup_decoder_depth)["decoder"] == pytest.approx((9 * 6) ** -0.25)
