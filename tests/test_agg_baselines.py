"""The depth-aggregation baselines: DenseFormer (arXiv:2402.02622), DLCL (Wang et al. 2019), LAuReL RW/LR/PA
(arXiv:2411.07501) and Hyper-Connections SHC/DHC (arXiv:2409.19606).

Each model against its paper's equations written out here in float64 (the fairseq Pre-LN layers as the
black-box f, or for hyper-connections the sublayers written out too), the initial model against the Pre-LN
transformer where the method starts as the identity, incremental == full decoding, parameter counts, option
errors, and fairseq-train + fairseq-generate end to end. Random small configurations of every family (and
their state_dict round trip), fp16 at E36D6 and resuming are covered by tests/test_properties.py,
tests/test_numerics.py and tests/test_resume.py, which pick the families up from the preset table."""

import io

import pytest
import torch
import torch.nn.functional as F
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_plugins.models import PRESETS
from fairseq_plugins.validation import PluginOptionError

from .equations import attention, ffn, layer_norm
from .helpers import (
    TinyTask,
    build_model,
    check_translates_every_sentence,
    full_and_incremental_logits,
    parameter_gradients,
    parse_model_args,
    random_batch,
    train_then_generate,
)
from .test_properties import right_pad

DEPTH = ["--encoder-layers", "5", "--decoder-layers", "4"]
BASELINE = "transformer_preln_e6d6"

# (arch, options): every family with its option variants
CONFIGS = [
    ("denseformer_e6d6", []),
    ("denseformer_e6d6", ["--denseformer-dilation", "2"]),
    ("denseformer_e6d6", ["--denseformer-dilation", "2", "--denseformer-period", "2"]),
    ("denseformer_e6d6", ["--denseformer-dilation", "3", "--denseformer-period", "2"]),
    ("dlcl_e6d6", []),
    ("dlcl_e6d6", ["--dlcl-init", "one"]),
    ("laurel_rw_e6d6", []),
    ("laurel_rw_e6d6", ["--laurel-rw-norm", "none"]),
    ("laurel_lr_e6d6", ["--laurel-rank", "3"]),
    ("laurel_pa_e6d6", ["--laurel-rank", "3"]),
    ("laurel_pa_e6d6", ["--laurel-rank", "2", "--laurel-pa-k", "2"]),
    ("hc_static_e6d6", []),
    ("hc_dynamic_e6d6", []),
    ("hc_dynamic_e6d6", ["--hc-rate", "2"]),
    ("hc_static_e6d6", ["--hc-rate", "1"]),
]
IDS = [" ".join([arch.removesuffix("_e6d6"), *extra]) for arch, extra in CONFIGS]


def baseline_keys() -> set[str]:
    return set(build_model(BASELINE, DEPTH).state_dict())


def randomize_new_weights(model, seed=0):
    """Move every weight the method adds (and the LayerNorms) well off its initial value."""
    known, g = baseline_keys(), torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name not in known or "layer_norm" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


# ------------------------------------------------------------------ the papers' equations, directly, float64


def denseformer_reference(stack, x, layer):
    """X_0 = x, X_i = B_i(Y_{i-1}); Y_i = sum_{j in S_i} a_{i,j} X_j if i mod p = 0 else X_i, S_i = {j <= i :
    j = i mod k}; output LN(Y_L)."""
    dwa, xs, y = stack.dwa, [x], x
    for i in range(1, len(stack.layers) + 1):
        xs.append(layer(i - 1, y))
        if i % dwa.period == 0:
            a = dwa.weights[str(i)]
            s = [j for j in range(i + 1) if j % dwa.dilation == i % dwa.dilation]
            assert len(a) == len(s) == i // dwa.dilation + 1
            y = sum(a[n] * xs[j] for n, j in enumerate(s))
        else:
            y = xs[i]
    return layer_norm(y, stack.layer_norm)


def dlcl_reference(stack, x, layer):
    """x_{l+1} = sum_{k<=l} W[l,k] LN_k(y_k), LN_0 = id; output LN(sum_{k<=L} W[L,k] LN_k(y_k))."""
    w, norms, entries = stack.dlcl.weight, stack.dlcl.layer_norms, [x]
    for l in range(len(stack.layers)):
        y = layer(l, sum(w[l, k] * entries[k] for k in range(l + 1)))
        entries.append(layer_norm(y, norms[l]))
    n = len(stack.layers)
    return layer_norm(sum(w[n, k] * entries[k] for k in range(n + 1)), stack.layer_norm)


def laurel_reference(stack, x, layer):
    """RW x' = a f(x) + b x; LR x' = f(x) + B A x + x; PA x' = f(x) + x + sum_{j<k} g_j B A x_{i-j}."""
    xs = [x]
    for i, conn in enumerate(stack.laurel):
        f = layer(i, xs[i]) - xs[i]
        if conn.variant == "rw":
            a, b = conn.rw.softmax(0) if conn.rw_norm == "softmax" else conn.rw
            xs.append(a * f + b * xs[i])
        elif conn.variant == "lr":
            xs.append(f + xs[i] @ conn.down.T @ conn.up.T + xs[i])
        else:
            mix = sum(conn.gamma[j] * (xs[i - j] @ conn.down.T @ conn.up.T) for j in range(len(conn.gamma)) if j <= i)
            xs.append(f + xs[i] + mix)
    return layer_norm(xs[-1], stack.layer_norm)


def hyper_connection_reference(hc, streams, branch):
    """h_in = sum_s A_m[s] H_s; H'_j = sum_s A_r[s,j] H_s; H_new_j = B_j T(h_in) + H'_j, with the dynamic terms
    s * tanh(LN(H_s) W) added to A_m[s], A_r[s, :] and B_s (W = [W_m | W_r] and W_b)."""
    n = len(streams)
    a_m = [hc.static_alpha[s, 0] for s in range(n)]
    a_r = [[hc.static_alpha[s, 1 + j] for j in range(n)] for s in range(n)]
    b = [hc.static_beta[s] for s in range(n)]
    if hc.dynamic:
        for s in range(n):
            normed = layer_norm(streams[s], hc.norm)
            w_m, w_r, w_b = hc.dynamic_weight[:, 0], hc.dynamic_weight[:, 1 : n + 1], hc.dynamic_weight[:, n + 1]
            a_m[s] = a_m[s] + hc.alpha_scale * torch.tanh(normed @ w_m)[..., None]
            gate_r = torch.tanh(normed @ w_r)[..., None, :]  # (T, B, 1, n)
            a_r[s] = [a_r[s][j] + hc.alpha_scale * gate_r[..., j] for j in range(n)]
            b[s] = b[s] + hc.beta_scale * torch.tanh(normed @ w_b)[..., None]
    out = branch(sum(a_m[s] * streams[s] for s in range(n)))
    return [b[j] * out + sum(a_r[s][j] * streams[s] for s in range(n)) for j in range(n)]


def hc_reference_forward(model, src, prev):
    """Embedding copied to n streams; every sublayer T(h) = F(LN(h)) through its hyper-connection; the output
    is LN(sum of the streams); the decoder's cross-attention reads the encoder output."""
    pad = src.eq(model.encoder.padding_idx)
    x, _ = model.encoder.forward_embedding(src)
    x = x.masked_fill(pad.unsqueeze(-1), 0).transpose(0, 1)
    n = model.encoder.carry.rate
    streams = [x] * n
    for layer in model.encoder.layers:
        streams = hyper_connection_reference(
            layer.hc[0], streams, lambda h, lay=layer: attention(*[layer_norm(h, lay.self_attn_layer_norm)] * 3,
                                                                 lay.self_attn, pad))  # fmt: skip
        streams = hyper_connection_reference(layer.hc[1], streams, lambda h, lay=layer: ffn(layer_norm(h, lay.final_layer_norm), lay))
    memory = layer_norm(sum(streams), model.encoder.layer_norm)

    d = model.decoder
    y = (d.embed_scale * d.embed_tokens(prev) + d.embed_positions(prev)).transpose(0, 1)
    streams = [y] * n
    for layer in d.layers:
        streams = hyper_connection_reference(
            layer.hc[0], streams, lambda h, lay=layer: attention(*[layer_norm(h, lay.self_attn_layer_norm)] * 3,
                                                                 lay.self_attn, causal=True))  # fmt: skip
        streams = hyper_connection_reference(
            layer.hc[1], streams, lambda h, lay=layer: attention(layer_norm(h, lay.encoder_attn_layer_norm), memory,
                                                                 memory, lay.encoder_attn, pad))  # fmt: skip
        streams = hyper_connection_reference(layer.hc[2], streams, lambda h, lay=layer: ffn(layer_norm(h, lay.final_layer_norm), lay))
    return layer_norm(sum(streams), d.layer_norm).transpose(0, 1)


REFERENCES = {"denseformer": denseformer_reference, "dlcl": dlcl_reference, "laurel": laurel_reference}


def reference_forward(model, src, prev, stack_reference):
    """Encoder and decoder through ``stack_reference(stack, embedding, layer)``; layer(i, h) runs fairseq's own
    Pre-LN layer i, which the method leaves unchanged."""
    enc, d = model.encoder, model.decoder
    pad = src.eq(enc.padding_idx)
    x, _ = enc.forward_embedding(src)
    x = x.masked_fill(pad.unsqueeze(-1), 0).transpose(0, 1)
    memory = stack_reference(enc, x, lambda i, h: enc.layers[i](h, encoder_padding_mask=pad))
    y = (d.embed_scale * d.embed_tokens(prev) + d.embed_positions(prev)).transpose(0, 1)
    mask = d.buffered_future_mask(y)
    return stack_reference(d, y, lambda i, h: d.layers[i](h, memory, pad, self_attn_mask=mask)[0]).transpose(0, 1)


@pytest.mark.parametrize("arch,extra", CONFIGS, ids=IDS)
def test_forward_matches_the_equations(arch, extra):
    model = randomize_new_weights(build_model(arch, [*DEPTH, *extra])).double()
    src, lengths, prev = random_batch(model, batch=3, src_len=6, tgt_len=5)
    with torch.no_grad():
        features, _ = model(src, lengths, prev, features_only=True)
        if arch.startswith("hc_"):
            expected = hc_reference_forward(model, src, prev)
        else:
            expected = reference_forward(model, src, prev, REFERENCES[PRESETS[arch].family.split("_")[0]])
    # fairseq's attention takes its softmax in float32 (utils.softmax), hence not 1e-12
    torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------ identity at init

# LAuReL-RW's bounded default (softmax, 0.5/0.5) is not the baseline at initialisation; its unbounded form is
IDENTITY_AT_INIT = [(a, e) for a, e in CONFIGS if not a.startswith("dlcl") and (not a.startswith("laurel_rw") or "none" in e)]


@pytest.mark.parametrize("arch,extra", IDENTITY_AT_INIT, ids=[" ".join([a, *e]) for a, e in IDENTITY_AT_INIT])
def test_initial_model_is_the_pre_ln_transformer(arch, extra):
    """With the baseline's weights copied in, the freshly initialised method computes the Pre-LN transformer:
    exactly for DenseFormer and LAuReL, and for hyper-connections up to the final LayerNorm's epsilon (the
    read-out is n times the Pre-LN stream)."""
    baseline = randomize_new_weights(build_model(BASELINE, DEPTH, seed=1))  # LayerNorms off 1/0 too
    model = build_model(arch, [*DEPTH, *extra], seed=2)
    result = model.load_state_dict(baseline.state_dict(), strict=False)
    assert not result.unexpected_keys and result.missing_keys
    batch = random_batch(model)
    with torch.no_grad():
        expected, _ = baseline(*batch)
        got, _ = model(*batch)
    exact = not arch.startswith("hc_") or "1" in extra
    torch.testing.assert_close(got, expected, **({"rtol": 0, "atol": 0} if exact else {"rtol": 1e-5, "atol": 1e-5}))


def test_initial_values_follow_the_papers():
    dense = build_model("denseformer_e6d6", ["--denseformer-dilation", "2"]).encoder.dwa.weights
    assert {i: a.tolist() for i, a in dense.items()} == {
        str(i): [0.0] * (i // 2) + [1.0] for i in range(1, 7)
    }  # a_{i,i} = 1, the rest 0
    w = build_model("dlcl_e6d6").decoder.dlcl.weight
    torch.testing.assert_close(w, torch.ones(7, 7).tril() / torch.arange(1, 8)[:, None])  # avg
    torch.testing.assert_close(build_model("dlcl_e6d6", ["--dlcl-init", "one"]).encoder.dlcl.weight, torch.ones(7, 7).tril())
    lr = build_model("laurel_pa_e6d6", ["--laurel-rank", "4"]).encoder.laurel[0]
    assert not lr.up.any() and lr.gamma.tolist() == [1.0, 1.0, 1.0]
    d = lr.down.shape[1]
    expected = torch.zeros(4, d)
    for i in range(d):
        expected[i % 4, i] = (4 * d) ** -0.5  # A_ij = 1/sqrt(rD) if i mod r = j (D x r, transposed)
    torch.testing.assert_close(lr.down.detach(), expected)
    hc = build_model("hc_dynamic_e6d6", ["--hc-rate", "3"]).decoder
    sites = [site for layer in hc.layers for site in layer.hc]
    assert len(sites) == 18  # 3 per decoder layer
    for k, site in enumerate(sites):
        a_m = torch.zeros(3)
        a_m[k % 3] = 1
        torch.testing.assert_close(site.static_alpha.detach(), torch.cat([a_m[:, None], torch.eye(3)], 1))
        assert site.static_beta.tolist() == [1.0] * 3 and not site.dynamic_weight.any()
        assert site.alpha_scale.item() == pytest.approx(0.01) and site.beta_scale.item() == pytest.approx(0.01)


# ------------------------------------------------------------------------------------------ decoding


@pytest.mark.parametrize("arch,extra", CONFIGS, ids=IDS)
def test_incremental_equals_full_decoding(arch, extra):
    model = randomize_new_weights(build_model(arch, [*DEPTH, *extra]))
    full, incremental = full_and_incremental_logits(model, *random_batch(model))
    torch.testing.assert_close(incremental, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["denseformer_e6d6", "dlcl_e6d6", "laurel_pa_e6d6", "hc_dynamic_e6d6"])
def test_activation_checkpointing_gives_the_same_gradients(arch):
    reference = randomize_new_weights(build_model(arch, ["--dropout", "0"])).train()
    checkpointed = build_model(arch, ["--dropout", "0", "--checkpoint-activations"]).train()
    checkpointed.load_state_dict(reference.state_dict())
    batch = random_batch(reference)
    grads = [parameter_gradients(model, batch) for model in (reference, checkpointed)]
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-5, msg=name)


FAMILY_ARCHS = ["denseformer_e6d6", "dlcl_e6d6", "laurel_rw_e6d6", "laurel_lr_e6d6", "laurel_pa_e6d6",
                 "hc_static_e6d6", "hc_dynamic_e6d6"]  # fmt: skip


@pytest.mark.parametrize("arch", FAMILY_ARCHS)
def test_checkpoint_round_trip(arch):
    """Saved and loaded (weights-only) into a model built with another seed: the same outputs, bit for bit."""
    model = randomize_new_weights(build_model(arch, DEPTH))
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict()}, buffer)
    buffer.seek(0)
    fresh = build_model(arch, DEPTH, seed=5)
    fresh.load_state_dict(torch.load(buffer, weights_only=True)["model"], strict=True)
    batch = random_batch(model)
    with torch.no_grad():
        torch.testing.assert_close(fresh(*batch)[0], model(*batch)[0], rtol=0, atol=0)


@pytest.mark.parametrize("arch", FAMILY_ARCHS)
def test_each_sentence_is_independent_of_its_batch_and_padding(arch):
    """The histories are per position: nothing mixes sentences of a batch or sees the padding."""
    model = randomize_new_weights(build_model(arch, DEPTH))
    src, lengths, prev = random_batch(model, batch=3, src_len=7)
    with torch.no_grad():
        batched, _ = model(src, lengths, prev)
        right, _ = model(right_pad(src, model.encoder.dictionary.pad()), lengths, prev)
        alone = [model(src[i : i + 1, src.size(1) - int(n) :], lengths[i : i + 1], prev[i : i + 1])[0]
                 for i, n in enumerate(lengths)]  # fmt: skip
    torch.testing.assert_close(torch.cat(alone), batched, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(right, batched, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------ sizes and options


def _count(arch, extra=()):
    model = build_model(arch, list(extra), tiny=False)
    return sum(p.numel() for p in model.parameters())


def test_added_parameters_are_the_papers_counts():
    """E6D6 at IWSLT width (D = 256): per stack of L = 6 layers."""
    base, d, L = _count("transformer_preln_iwslt_e6d6"), 256, 6
    added = {
        "denseformer": 2 * sum(i + 1 for i in range(1, L + 1)),  # DWA i: i + 1 weights
        "dlcl": 2 * ((L + 1) ** 2 + L * 2 * d),  # W and L LayerNorms
        "laurel_rw": 2 * L * 2,  # alpha, beta per layer
        "laurel_lr": 2 * L * 2 * 32 * d,  # 2rD, r = 32
        "laurel_pa": 2 * L * (2 * 32 * d + 3),  # 2rD + k
        "hc_static": (2 * L + 3 * L) * (4 + 4 * 5),  # per site: B (n) and [A_m | A_r] (n x (n + 1)), n = 4
        "hc_dynamic": (2 * L + 3 * L) * (4 + 4 * 5 + 2 * d + d * 5 + d + 2),  # + LN, W_m|W_r, W_b, s_a, s_b
    }
    for family, n in added.items():
        assert _count(f"{family}_iwslt_e6d6") - base == n, family
    assert _count("denseformer_iwslt_e6d6", ["--denseformer-dilation", "4", "--denseformer-period", "2"]) - base == 2 * (
        (2 // 4 + 1) + (4 // 4 + 1) + (6 // 4 + 1)
    )


@pytest.mark.parametrize(
    "arch,extra,message",
    [
        ("denseformer_e6d6", ["--denseformer-dilation", "0"], "--denseformer-dilation must be an integer in [1, 10000]"),
        ("denseformer_e6d6", ["--denseformer-period", "x"], "--denseformer-period must be an integer"),
        ("dlcl_e6d6", ["--dlcl-init", "zero"], "--dlcl-init must be one of avg, one"),
        ("laurel_lr_e6d6", ["--laurel-rank", "0"], "--laurel-rank must be an integer in [1, 65536]"),
        ("laurel_pa_e6d6", ["--laurel-pa-k", "65"], "--laurel-pa-k must be an integer in [1, 64]"),
        ("laurel_rw_e6d6", ["--laurel-variant", "rw+lr"], "--laurel-variant must be one of rw, lr, pa"),
        ("laurel_rw_e6d6", ["--laurel-rw-norm", "sigmoid"], "--laurel-rw-norm must be one of none, softmax"),
        ("hc_static_e6d6", ["--hc-rate", "0"], "--hc-rate must be an integer in [1, 64]"),
        ("hc_static_e6d6", ["--hc-mode", "both"], "--hc-mode must be one of static, dynamic"),
    ],
)
def test_bad_options_are_rejected_at_parse_time(arch, extra, message, capsys):
    with pytest.raises(SystemExit):
        parse_model_args(arch, extra)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("arch", ["denseformer_e6d6", "dlcl_e6d6", "laurel_lr_e6d6", "hc_dynamic_e6d6"])
@pytest.mark.parametrize(
    "name,value,message",
    [
        # the stacks compose with every residual choice; the preset's --residual pre is what needs Pre-LN
        ("encoder_normalize_before", False, "--encoder-normalize-before must be set with --residual pre"),
        ("decoder_layerdrop", 0.1, "--decoder-layerdrop"),
        ("cross_self_attention", True, "--cross-self-attention cannot be used"),
    ],
)
def test_python_api_options_are_checked_in_build_model(arch, name, value, message):
    args = parse_model_args(arch)
    setattr(args, name, value)
    with pytest.raises(PluginOptionError) as err:
        ARCH_MODEL_REGISTRY[arch].build_model(args, TinyTask())
    assert message in str(err.value)
    assert name == "encoder_normalize_before" or PRESETS[arch].model in str(err.value)


@pytest.mark.parametrize(
    "arch,name,value,message",
    [
        ("laurel_pa_e6d6", "laurel_rank", -1, "--laurel-rank must be an integer in [1, 65536]"),
        ("hc_static_e6d6", "hc_rate", 2.5, "--hc-rate must be an integer"),
        ("denseformer_e6d6", "denseformer_period", 0, "--denseformer-period must be an integer in [1, 10000]"),
    ],
)
def test_python_api_values_are_checked(arch, name, value, message):
    args = parse_model_args(arch)
    setattr(args, name, value)
    with pytest.raises(PluginOptionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ARCH_MODEL_REGISTRY[arch].build_model(args, TinyTask())


def test_named_architectures():
    expected = {
        "denseformer": ("denseformer_transformer", {"denseformer_dilation": 1, "denseformer_period": 1}),
        "dlcl": ("dlcl_transformer", {"dlcl_init": "avg"}),
        "laurel_rw": ("laurel_transformer", {"laurel_variant": "rw"}),
        "laurel_lr": ("laurel_transformer", {"laurel_variant": "lr", "laurel_rank": 32}),
        "laurel_pa": ("laurel_transformer", {"laurel_variant": "pa", "laurel_pa_k": 3}),
        "hc_static": ("hc_transformer", {"hc_mode": "static", "hc_rate": 4}),
        "hc_dynamic": ("hc_transformer", {"hc_mode": "dynamic", "hc_rate": 4}),
    }
    for family, (model, settings) in expected.items():
        archs = [a for a, p in PRESETS.items() if p.family == family]
        assert len(archs) == 16 and all(PRESETS[a].model == model for a in archs)
        for arch in (f"{family}_e36d6", f"{family}_iwslt_e12d12"):
            args = parse_model_args(arch, tiny=False)
            assert args.encoder_normalize_before and args.decoder_normalize_before
            assert {k: getattr(args, k) for k in settings} == settings


# ------------------------------------------------------------------------------------------- end to end


END_TO_END = ["denseformer_e12d6", "hc_dynamic_e6d6"]


@pytest.fixture(scope="module")
def generated(corpus_bin, tmp_path_factory, in_one_forked_process):
    return train_then_generate(corpus_bin, tmp_path_factory.mktemp("end_to_end"), END_TO_END, in_one_forked_process)


@pytest.mark.parametrize("arch", END_TO_END)
def test_train_then_generate_translates_every_sentence(arch, generated):
    check_translates_every_sentence(*generated[arch])


def test_half_precision_forward_matches_float32_at_init():
    """fp16 at depth: DLCL's LayerNorm'd entries and the n-fold hyper-connection streams stay in range."""
    for arch in ("dlcl_iwslt_e36d6", "hc_dynamic_iwslt_e36d6"):
        model = build_model(arch, tiny=False)
        batch = random_batch(model, batch=2, src_len=8, tgt_len=6)
        with torch.no_grad():
            expected = F.log_softmax(model(*batch)[0].double(), -1)
            got = F.log_softmax(model.half()(*batch)[0].double(), -1)
        torch.testing.assert_close(got, expected, rtol=0, atol=0.05)


def test_laurel_rw_is_bounded_by_default():
    """The paper (section 2.1) keeps RW's weights bounded in practice: softmax by default, 0.5/0.5 at init."""
    conn = build_model("laurel_rw_e6d6").encoder.laurel[0]
    assert conn.rw_norm == "softmax"
    torch.testing.assert_close(conn.residual_weights(), torch.tensor([0.5, 0.5]))
    conn.rw.data = torch.tensor([30.0, -30.0])
    assert float(conn.residual_weights().detach().max()) <= 1.0
    assert build_model("laurel_rw_e6d6", ["--laurel-rw-norm", "none"]).encoder.laurel[0].rw.tolist() == [1.0, 1.0]
