"""DeepCrossAttention (arXiv:2502.06785, sections 3 and 5): GRN math against the paper's equations in float64,
the k-DCA stack, the whole model against a direct re-implementation, init-equivalence with the Pre-LN baseline,
incremental decoding, options, parameter counts, and fairseq-train + fairseq-generate end to end."""


import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator

from fairseq_plugins.models import PRESETS
from fairseq_plugins.modules.dca import initial_dca_state
from fairseq_plugins.modules.depth_stack import DepthStack
from fairseq_plugins.modules.grn import GRNv1, GRNv2, GRNv3, count_grn_parameters
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

MODES = ["dca", "grn-v1", "grn-v2", "grn-v3"]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
DEPTH = ["--encoder-layers", "4", "--decoder-layers", "4"]  # k = 1 and 2 form a middle sum, k = 3 does not

# ------------------------------------------------------------------ the paper's equations, directly, float64


def grn_reference(stack, b, w):
    """Section 3.1 for a stack (entries, *, d): v1 G b; v2 (G ⊙ b) 1; v3 (G ⊙ (b + 1 σ(wᵀĜ))) 1, with
    ĝ = g / rms(g) and σ = ReLU written as clamp(min=0), whose derivative at 0 is 1 (grn.py's choice)."""
    weights = b[:, :, *([None] * (stack.dim() - 2)), :]  # (outputs, entries, *1, d or 1)
    if w is not None:
        normed = stack / stack.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        weights = weights + torch.einsum("m...c,oc->om...", normed, w).clamp(min=0)[..., None]
    return (weights * stack).sum(1)


def k_stack(entries, k):
    """k-DCA's stack from the full list [x, f_0, ..., f_{t-1}]: [x, f_0 + ... + f_{t-k-1}, last k]."""
    if k == 0 or len(entries) <= k + 1:
        return torch.stack(entries)
    return torch.stack([entries[0], sum(entries[1:-k]), *entries[-k:]])


def dca_stack_forward(x, layers, output_grn, final_norm, k, block):
    """One encoder or decoder: every layer reads GRN(G_t); block(layer, q_in, query, key, value) -> f_t."""
    entries = [x]
    for layer in layers:
        x_in = grn_reference(k_stack(entries, k), layer.grn.b, layer.grn.w)
        h = layer_norm(x_in, layer.self_attn_layer_norm)
        q, kk, v = h if h.size(0) == 3 else (h[0], h[0], h[0])
        entries.append(block(layer, x_in[0], q, kk, v))
    return layer_norm(grn_reference(k_stack(entries, k), output_grn.b, output_grn.w)[0], final_norm)


def reference_forward(model, src, prev, k):
    src_pad = src.eq(model.encoder.padding_idx)
    x, _ = model.encoder.forward_embedding(src)
    x = x.masked_fill(src_pad.unsqueeze(-1), 0).transpose(0, 1)

    def encoder_block(layer, q_in, q, kk, v):
        a = attention(q, kk, v, layer.self_attn, src_pad)
        return a + ffn(layer_norm(q_in + a, layer.final_layer_norm), layer)

    enc = model.encoder
    memory = dca_stack_forward(x, enc.layers, enc.output_grn, enc.layer_norm, k, encoder_block)

    def decoder_block(layer, q_in, q, kk, v):
        a = attention(q, kk, v, layer.self_attn, causal=True)
        c = attention(layer_norm(q_in + a, layer.encoder_attn_layer_norm), memory, memory, layer.encoder_attn, src_pad)
        return a + c + ffn(layer_norm(q_in + a + c, layer.final_layer_norm), layer)

    d = model.decoder
    y = (d.embed_scale * d.embed_tokens(prev) + d.embed_positions(prev)).transpose(0, 1)
    return dca_stack_forward(y, d.layers, d.output_grn, d.layer_norm, k, decoder_block).transpose(0, 1)


def randomize_dca(model, seed=0):
    """Non-initial GRN weights (b around 1, w of both signs) and LayerNorm parameters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("grn.b"):
                p.add_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif name.endswith("grn.w") or "layer_norm" in name:
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


# ------------------------------------------------------------------------------------------------ GRNs


@pytest.mark.parametrize("cls", [GRNv1, GRNv2, GRNv3])
@pytest.mark.parametrize("outputs", [1, 3])
def test_grn_matches_the_equations_and_their_gradients(cls, outputs):
    torch.manual_seed(0)
    grn = cls(6, 5, outputs).double()
    norm = torch.nn.LayerNorm(6).double()
    with torch.no_grad():
        for p in [*grn.parameters(), *norm.parameters()]:
            p.copy_(torch.randn_like(p))
    stack = torch.randn(5, 3, 2, 6, dtype=torch.double, requires_grad=True)
    params = [stack, *grn.parameters(), *norm.parameters()]
    chunks = [stack[:1], stack[1:2], stack[2:]]  # embedding, middle sum, window: as DepthStack hands them over

    def check(got, expected):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
        probe = torch.randn(got.shape, dtype=got.dtype, generator=torch.Generator().manual_seed(1))
        got_grads = torch.autograd.grad((got * probe).sum(), params, allow_unused=True)
        expected_grads = torch.autograd.grad((expected * probe).sum(), params, allow_unused=True)
        for a, b in zip(got_grads, expected_grads, strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)

    check(grn(chunks), grn_reference(stack, grn.b, grn.w))
    first, normed = grn(chunks, norm=norm)  # the fused LayerNorm of the layers (x recomputed in backward)
    expected = grn_reference(stack, grn.b, grn.w)
    check(torch.cat([first[None], normed]), torch.cat([expected[:1], norm(expected)]))
    with torch.no_grad():  # the decoding path
        torch.testing.assert_close(grn(chunks), grn_reference(stack, grn.b, grn.w), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda s, *p: grn([s[:2], s[2:]], norm=norm)[1], (stack, *grn.parameters()))


@pytest.mark.parametrize("cls", [GRNv1, GRNv2, GRNv3])
@pytest.mark.parametrize("grad", [True, False])
def test_grn_mixes_an_empty_batch(cls, grad):
    """Zero tokens (an empty batch): the kernel refuses it and the PyTorch path runs, which reshaped with -1."""
    grn, norm = cls(8, 4, 2), torch.nn.LayerNorm(8)
    stack = torch.randn(4, 0, 3, 8, requires_grad=grad)
    with torch.set_grad_enabled(grad):
        out = grn([stack[:1], stack[1:]])
        first, normed = grn([stack[:1], stack[1:]], norm=norm)
    assert out.shape == (2, 0, 3, 8) and first.shape == (0, 3, 8) and normed.shape == (2, 0, 3, 8)
    if grad:
        (out.sum() + normed.sum()).backward()
        assert stack.grad.shape == stack.shape


@pytest.mark.parametrize("cls", [GRNv1, GRNv2, GRNv3])
def test_grn_starts_as_the_plain_sum_and_w_can_leave_zero(cls):
    grn = cls(8, 4, 3)
    stack = torch.randn(4, 5, 2, 8, requires_grad=True)
    out = grn([stack])
    torch.testing.assert_close(out, stack.sum(0).expand(3, -1, -1, -1))
    out.pow(2).sum().backward()
    if cls is GRNv3:  # σ'(0) = 1: with ReLU's usual 0 there, w would never move from its initial zeros
        assert grn.w.grad.abs().min() > 0


def test_grn_in_half_precision_keeps_large_entries_finite():
    """rms > 256 overflows a half-precision mean square; ρ is taken in float32 (grn.py)."""
    grn = GRNv3(512, 3, 3)
    with torch.no_grad():
        grn.w.normal_(0, 0.02)
    stack = 300 * torch.randn(3, 4, 2, 512, generator=torch.Generator().manual_seed(0))
    expected = grn_reference(stack.double(), grn.b.double(), grn.w.double())
    half, entries = grn.half(), stack.half().requires_grad_()
    out = half([entries])
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).half() * 1e-3)
    assert torch.isfinite(entries.grad).all() and torch.isfinite(half.w.grad).all()
    torch.testing.assert_close(out.double(), expected, rtol=1e-2, atol=1.0)


# ------------------------------------------------------------------------------------------- the stack


@pytest.mark.parametrize("k", [1, 2, 3])
def test_k_dca_stack_holds_embedding_middle_sum_and_last_k(k):
    x = torch.randn(3, 2, 8, requires_grad=True)
    outputs = [torch.randn(3, 2, 8, requires_grad=True) for _ in range(7)]
    stack, full = DepthStack(x, 7, k), DepthStack(x, 7, 0)
    for t, f in enumerate(outputs):
        stack.push(f)
        full.push(f)
        got = torch.cat(stack.chunks())
        entries = [x, *outputs[: t + 1]]
        torch.testing.assert_close(got, k_stack(entries, k))
        torch.testing.assert_close(torch.cat(full.chunks()), torch.stack(entries))
        assert got.size(0) == min(t + 2, k + 2)  # flat with depth
        torch.testing.assert_close(stack.plain_sum(), full.plain_sum())  # same residual stream
    # gradients reach every output through the buffer, the windows and the running middle sum
    probe = torch.randn(got.shape, generator=torch.Generator().manual_seed(0))
    (torch.cat(stack.chunks()) * probe).sum().backward()
    expected = torch.autograd.grad((k_stack([x, *outputs], k) * probe).sum(), [x, *outputs])
    for tensor, grad in zip([x, *outputs], expected, strict=True):
        torch.testing.assert_close(tensor.grad, grad)


@pytest.mark.parametrize("k", [0, 2])
def test_decoding_stack_keeps_its_middle_sum_in_place_and_one_grn_workspace(k):
    """Without autograd the middle sum lives in the buffer's extra slot, updated in place, and every GRN of the
    pass gets the same output tensors: same stack as with autograd, no new tensors per layer."""
    x, outputs = torch.randn(3, 2, 8), [torch.randn(3, 2, 8) for _ in range(6)]
    with torch.no_grad():
        stack = DepthStack(x, 6, k)
        workspace = stack.grn_out(3)
        for t, f in enumerate(outputs):
            stack.push(f)
            torch.testing.assert_close(torch.cat(stack.chunks()), k_stack([x, *outputs[: t + 1]], k))
            first, h = stack.grn_out(3)
            assert first is workspace[0] and h.data_ptr() == workspace[1].data_ptr() and h.shape == (3, 3, 2, 8)
        assert stack.grn_out(1)[1].shape == (1, 3, 2, 8)
        if k:
            assert stack.middle.data_ptr() == stack.buffer[-1].data_ptr()
    assert DepthStack(x, 6, k).grn_out(3) is None  # with autograd: no shared outputs


def test_full_stack_is_read_from_the_buffer_without_copies():
    x = torch.randn(3, 2, 8, requires_grad=True)
    stack = DepthStack(x, 4)
    for _ in range(4):
        stack.push(torch.randn(3, 2, 8, requires_grad=True))
        (chunk,) = stack.chunks()
        assert chunk.untyped_storage().data_ptr() == stack.buffer.untyped_storage().data_ptr()


# ------------------------------------------------------------------------------------------- the model


@pytest.mark.parametrize("mode,k", [("dca", 0), ("dca", 2), ("grn-v1", 1), ("grn-v2", 0), ("grn-v3", 2)])
def test_forward_matches_a_direct_implementation(mode, k):
    model = build_model("dca_e6d6", [*DEPTH, "--dca-mode", mode, "--dca-k", str(k)]).double()
    randomize_dca(model)
    src, lengths, prev = random_batch(model, batch=3, src_len=6, tgt_len=5)
    with torch.no_grad():
        features, _ = model(src, lengths, prev, features_only=True)
        expected = reference_forward(model, src, prev, k)
    # fairseq's attention takes its softmax in float32 (utils.softmax), hence not 1e-12
    torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-6)


def test_self_attention_reads_separate_keys_and_values_on_every_path():
    """fairseq's attention has a fused path (training, full-sequence decoding) and a Python one (TorchScript,
    ONNX, pruned heads, incremental decoding); both must read GRN_k and GRN_v, not project the query."""
    model = randomize_dca(build_model("dca_e6d6", DEPTH))
    batch = random_batch(model)
    with torch.no_grad():
        fused, _ = model(*batch)
        for layer in [*model.encoder.layers, *model.decoder.layers]:
            layer.self_attn.skip_embed_dim_check = True  # one of the switches that bypass the fused path
        python_path, _ = model(*batch)
    torch.testing.assert_close(python_path, fused, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k", ["0", "1", "2"])
def test_initial_model_is_the_pre_ln_transformer(mode, k):
    """Paper section 5 ("identical to a standard residual network at initialization"), with copied weights."""
    baseline = build_model("transformer_preln_e6d6", DEPTH, seed=1)
    model = build_model("dca_e6d6", [*DEPTH, "--dca-mode", mode, "--dca-k", k], seed=2)
    initial = {name: value.clone() for name, value in model.state_dict().items()}
    result = model.load_state_dict(baseline.state_dict(), strict=False)
    assert not result.unexpected_keys
    added = initial_dca_state(parse_model_args("dca_e6d6", [*DEPTH, "--dca-mode", mode, "--dca-k", k]))
    assert sorted(result.missing_keys) == sorted(added)  # what retrofit_dca.py adds, by name and value
    for name, value in added.items():
        torch.testing.assert_close(initial[name], value)
    batch = random_batch(model)
    with torch.no_grad():
        expected, _ = baseline(*batch)
        got, _ = model(*batch)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode,k", [("dca", "0"), ("dca", "2"), ("grn-v3", "1")])
def test_incremental_equals_full_decoding(mode, k):
    model = randomize_dca(build_model("dca_e6d6", [*DEPTH, "--dca-mode", mode, "--dca-k", k]))
    full, incremental = full_and_incremental_logits(model, *random_batch(model))
    torch.testing.assert_close(incremental, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [0, 2])
def test_runs_on_the_device_of_its_inputs_without_host_round_trips(device, k, monkeypatch):
    """The same code on any device (issue 15, item 3): stack buffer, GRN outputs and gradients live where the
    inputs do, and neither the training nor the decoding path copies to the host (.cpu(), .numpy(), .item(),
    .tolist() are banned while the model runs). Checked against the float64 equations on the CPU."""
    model = randomize_dca(build_model("dca_e6d6", [*DEPTH, "--dca-k", str(k)])).double()
    batch = random_batch(model, batch=3, src_len=6, tgt_len=5)
    with torch.no_grad():
        expected = reference_forward(model, batch[0], batch[2], k)
    features, _ = model(*batch, features_only=True)
    features.pow(2).sum().backward()
    cpu_grads = {name: p.grad for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    model = model.to(device)
    src, lengths, prev = (t.to(device) for t in batch)

    def banned(*args, **kwargs):
        raise AssertionError("host round trip on the hot path")

    for name in ("cpu", "numpy", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, banned)
    features, _ = model(src, lengths, prev, features_only=True)  # the training path (autograd Functions)
    features.pow(2).sum().backward()
    full, incremental = full_and_incremental_logits(model, src, lengths, prev)  # the decoding path
    monkeypatch.undo()
    assert features.device.type == device == incremental.device.type
    torch.testing.assert_close(features.cpu(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(incremental, full, rtol=1e-5, atol=1e-5)
    for name, p in model.named_parameters():
        if cpu_grads[name] is None:  # not used for the features (the output projection)
            assert p.grad is None, name
            continue
        assert p.grad.device.type == device, name
        torch.testing.assert_close(p.grad.cpu(), cpu_grads[name], rtol=1e-6, atol=1e-8, msg=name)


def test_torchscript_export_is_refused_with_a_clear_error():
    """fairseq's export test scripts the model and a SequenceGenerator (issue 17, item 2). DCA cannot be
    scripted (autograd Functions, a variable number of stack chunks per layer, a Python DepthStack carried
    through the layer loop): both say so, naming DCA and the reason, instead of TorchScript's
    "Unknown type annotation: GRN"."""
    model = build_model("dca_k2_e6d6", DEPTH)
    for scriptable in (model, SequenceGenerator([model], model.decoder.dictionary, beam_size=2)):
        with pytest.raises(RuntimeError, match=r"cannot be exported with TorchScript \(torch.jit.script\): "
                           r"DeepCrossAttention's GRNs and depth stack run hand-written torch.autograd.Function"):
            torch.jit.script(scriptable)


def test_training_step_in_half_precision_and_with_activation_checkpointing():
    reference = randomize_dca(build_model("dca_k2_e6d6", ["--dropout", "0"])).train()
    checkpointed = build_model("dca_k2_e6d6", ["--dropout", "0", "--checkpoint-activations"]).train()
    checkpointed.load_state_dict(reference.state_dict())
    batch = random_batch(reference)
    grads = [parameter_gradients(model, batch) for model in (reference, checkpointed)]
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-5, msg=name)
    half = reference.half()
    logits, _ = half(*batch)
    logits.float().logsumexp(-1).mean().backward()
    assert torch.isfinite(logits).all() and all(torch.isfinite(p.grad).all() for p in half.parameters())


# ----------------------------------------------------------------------------------- options and sizes


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--dca-k", "-1"], "--dca-k must be an integer in [0, "),
        (["--dca-k", "two"], "--dca-k must be an integer"),
        (["--dca-mode", "grn-v4"], "--dca-mode must be one of grn-v1, grn-v2, grn-v3, dca"),
    ],
)
def test_bad_options_are_rejected_at_parse_time(extra, message, capsys):
    with pytest.raises(SystemExit):
        parse_model_args("dca_e6d6", extra)
    assert message in capsys.readouterr().err


def test_dca_k_larger_than_the_depth_is_rejected():
    with pytest.raises(PluginOptionError, match=r"--dca-k must be an integer in \[0, 6\], got 7"):
        build_model("dca_e6d6", ["--dca-k", "7"])
    build_model("dca_e18d6", ["--dca-k", "7"])  # bounded by the deeper side


@pytest.mark.parametrize(
    "name,value,message",
    [
        ("encoder_normalize_before", False, "--encoder-normalize-before"),
        ("decoder_layerdrop", 0.1, "--decoder-layerdrop"),
        ("dca_mode", "grn", "--dca-mode must be one of"),
        ("dca_k", -2, "--dca-k must be an integer in [0, 6]"),
    ],
)
def test_python_api_options_are_checked_in_build_model(name, value, message):
    args = parse_model_args("dca_e6d6")
    setattr(args, name, value)
    with pytest.raises(PluginOptionError) as err:
        ARCH_MODEL_REGISTRY["dca_e6d6"].build_model(args, TinyTask())
    assert message in str(err.value)


def test_named_architectures():
    for family, k in (("dca", 0), ("dca_k2", 2)):
        for width in ("", "iwslt_"):
            for depth in ("e6d6", "e12d12", "e18d18", "e24d24", "e12d6", "e18d6", "e24d6", "e36d6"):
                arch = f"{family}_{width}{depth}"
                assert PRESETS[arch].model == "dca_transformer"
                args = parse_model_args(arch, tiny=False)
                assert (args.dca_mode, args.dca_k) == ("dca", k)
                assert args.encoder_normalize_before and args.decoder_normalize_before


def _meta_model(arch):
    args = parse_model_args(arch, ["--share-all-embeddings"], tiny=False)
    with torch.device("meta"):
        return ARCH_MODEL_REGISTRY[arch].build_model(args, TinyTask(32000))


@pytest.mark.parametrize("arch,grn_params", [("dca_e18d18", 601_088), ("dca_k2_e18d18", 263_168)])
def test_grn_parameters_are_a_negligible_addition(arch, grn_params):
    """Per side: 3 GRN-v3 per layer with (entries + 1) x d parameters each, and one output GRN-v3."""
    model, baseline = _meta_model(arch), _meta_model("transformer_preln_e18d18")
    total = sum(p.numel() for p in model.parameters())
    assert count_grn_parameters(model) == grn_params == total - sum(p.numel() for p in baseline.parameters())
    assert grn_params / total < 0.005
    if "k2" in arch:  # flat with depth: every layer from the fourth on reads 4 entries
        assert {layer.grn.b.shape[1] for layer in model.encoder.layers[3:]} == {4}


# ------------------------------------------------------------------------------------------- end to end


END_TO_END = ["dca_e18d18", "dca_k2_e36d6"]


@pytest.fixture(scope="module")
def generated(corpus_bin, tmp_path_factory, in_one_forked_process):
    return train_then_generate(corpus_bin, tmp_path_factory.mktemp("end_to_end"), END_TO_END, in_one_forked_process)


@pytest.mark.parametrize("arch", END_TO_END)
def test_train_then_generate_translates_every_sentence(arch, generated):
    check_translates_every_sentence(*generated[arch])
