"""nGPT as ``--residual ngpt`` (modules/ngpt.py, axes/residual_sites.py ``NGPT``): the model against a float64
re-implementation of the paper's equations (arXiv:2410.01131, as the authors' NVIDIA/ngpt model.py computes
them), the initial state they imply, the per-step weight projection, incremental decoding, a train step, a
checkpoint round trip, half precision and the refusals it declares."""

import copy
import io
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fairseq_plugins.axes import IncompatibleChoices
from fairseq_plugins.modules import ngpt
from fairseq_plugins.validation import PluginOptionError

from .helpers import (
    build_model,
    full_and_incremental_logits,
    parameter_gradients,
    parse_model_args,
    random_batch,
)
from .lm_helpers import (
    assert_incremental_equals_full,
    binarize_lm,
    build_lm,
    make_lm_corpus,
    train_batch,
)

SHAPE = ["--encoder-layers", "2", "--decoder-layers", "2", "--dropout", "0"]
ARCH = "ngpt_e6d6"


# ---- the paper's equations, float64 (the design note's section 5) ------------------------------------------


def sph(x, dim=-1):
    return x / x.norm(dim=dim, keepdim=True).clamp_min(1e-12)


def eff(p, init, scale):
    return p * (init / scale)


def update(h, f, a):
    """h <- Norm(Norm(h) + |alpha_eff| (Norm(h_F) - Norm(h)))."""
    return sph(sph(h) + eff(a.alpha, a.init, a.scale).abs() * (sph(f) - sph(h)))


def attention(attn, x, y, mask=None, key_padding=None):
    """q = s_qk Norm_head(x Wq^T), k = s_qk Norm_head(y Wk^T), v = y Wv^T; softmax(q.k sqrt(d_h)) v Wo^T."""
    heads, d_h = attn.num_heads, attn.head_dim
    s_qk = eff(attn.q_proj.s_qk, 1.0, attn.q_proj.scale).view(heads, d_h)
    q = sph((x @ attn.q_proj.weight.T).unflatten(-1, (heads, d_h))) * s_qk
    k = sph((y @ attn.k_proj.weight.T).unflatten(-1, (heads, d_h))) * s_qk
    v = (y @ attn.v_proj.weight.T).unflatten(-1, (heads, d_h))
    scores = torch.einsum("tbhd,sbhd->bhts", q, k) * math.sqrt(d_h)
    if mask is not None:
        scores = scores + mask
    if key_padding is not None:
        scores = scores.masked_fill(key_padding[:, None, None, :], float("-inf"))
    out = torch.einsum("bhts,sbhd->tbhd", scores.softmax(-1), v).flatten(-2)
    return out @ attn.out_proj.weight.T


def ffn(layer, x):
    """act((x W1^T) * s_v * sqrt(C)) W2^T (fairseq's ungated FFN, s_v on fc1's output)."""
    act = layer.activation_fn
    return act.activation((x @ layer.fc1.weight.T) * act.s_v * math.sqrt(x.shape[-1])) @ layer.fc2.weight.T


def reference_logits(model, src, prev):
    enc, dec = model.encoder, model.decoder
    pad = src.eq(enc.dictionary.pad())
    x = (enc.embed_scale * enc.embed_tokens(src) + enc.embed_positions(src)) * (~pad).unsqueeze(-1)
    x = x.transpose(0, 1)
    for layer in enc.layers:
        x = update(x, attention(layer.self_attn, x, x, key_padding=pad), layer.site_update["self_attn"])
        x = update(x, ffn(layer, x), layer.site_update["ffn"])
    h = (dec.embed_scale * dec.embed_tokens(prev) + dec.embed_positions(prev)).transpose(0, 1)
    causal = torch.full((prev.size(1),) * 2, float("-inf"), dtype=h.dtype).triu(1)
    for layer in dec.layers:
        h = update(h, attention(layer.self_attn, h, h, mask=causal), layer.site_update["self_attn"])
        h = update(h, attention(layer.encoder_attn, h, x, key_padding=pad), layer.site_update["encoder_attn"])
        h = update(h, ffn(layer, h), layer.site_update["ffn"])
    logits = h.transpose(0, 1) @ dec.output_projection.weight.T  # no final norm
    return eff(dec.output_projection.s_z, 1.0, dec.output_projection.scale) * logits


def perturbed(model, seed=3, scale=0.05):
    """``model`` with every parameter moved off its init (and off the sphere)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    return model


def unit_along_c(model) -> bool:
    """Every matrix of every stack has unit rows/columns along C (zero padding rows allowed)."""
    for side in (getattr(model, "encoder", None), model.decoder):  # an LM has no encoder
        for weight, dim in ngpt.stack_matrices(side):
            norms = weight.double().norm(dim=dim)
            if not torch.allclose(norms[norms > 0], torch.ones_like(norms[norms > 0]), atol=1e-6, rtol=0):
                return False
    return True


# ---- equations ---------------------------------------------------------------------------------------------


def test_the_update_is_the_papers_and_moves_by_the_lerp_angle():
    torch.manual_seed(0)
    site = ngpt.SphereUpdate(16).double()
    h, f = 3 * torch.randn(5, 2, 16, dtype=torch.float64), torch.randn(5, 2, 16, dtype=torch.float64)
    out = site(f, h)
    torch.testing.assert_close(out, sph(sph(h) + 0.05 * (sph(f) - sph(h))), rtol=0, atol=1e-14)
    theta = torch.arccos((sph(h) * sph(f)).sum(-1).clamp(-1, 1))
    moved = torch.arccos((sph(h) * out).sum(-1).clamp(-1, 1))
    expected = torch.atan(0.05 * theta.sin() / (0.95 + 0.05 * theta.cos()))
    torch.testing.assert_close(moved, expected, rtol=0, atol=1e-7)
    with torch.no_grad():  # a learned, signed, per-dimension step: |alpha_eff| is used
        site.alpha.copy_(torch.linspace(-0.3, 0.3, 16, dtype=torch.float64))
    torch.testing.assert_close(site(f, h), update(h, f, site), rtol=0, atol=1e-14)


def test_the_model_equals_the_equations_in_float64():
    model = perturbed(build_model(ARCH, SHAPE, seed=1)).double()
    src, lengths, prev = random_batch(model)
    with torch.no_grad():
        logits, _ = model(src, lengths, prev)
        expected = reference_logits(model, src, prev)
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-7)  # fairseq softmaxes attention in float32


# ---- initial state -----------------------------------------------------------------------------------------


def test_initial_state():
    model = build_model(ARCH, SHAPE, seed=1).double()
    assert unit_along_c(model)
    matrices = {id(w) for side in (model.encoder, model.decoder) for w, _ in ngpt.stack_matrices(side)}
    assert matrices == {id(p) for p in model.parameters() if p.dim() == 2}  # every matrix is on the sphere
    pad = model.encoder.dictionary.pad()
    assert not model.encoder.embed_tokens.weight[pad].any()
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
    assert model.encoder.layer_norm is None and model.decoder.layer_norm is None
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        assert all(m.bias is None for m in layer.modules() if isinstance(m, (nn.Linear, ngpt.SphereQK)))
        assert layer.self_attn.scaling == math.sqrt(layer.self_attn.head_dim)
        for site in layer.site_update.values():
            torch.testing.assert_close(eff(site.alpha, site.init, site.scale), torch.full_like(site.alpha, 0.05))
        q = layer.self_attn.q_proj
        torch.testing.assert_close(eff(q.s_qk, 1.0, q.scale), torch.ones_like(q.s_qk))
        assert layer.self_attn.k_proj.s_qk is None
        torch.testing.assert_close(layer.activation_fn.s_v, torch.ones_like(layer.activation_fn.s_v))
    out = model.decoder.output_projection
    torch.testing.assert_close(eff(out.s_z, 1.0, out.scale), torch.ones_like(out.s_z))
    norms = []
    hooks = [m.register_forward_hook(lambda m, i, o: norms.append(o.norm(dim=-1)))
             for m in model.modules() if isinstance(m, ngpt.SphereUpdate)]  # fmt: skip
    src, lengths, prev = random_batch(model)
    with torch.no_grad():
        logits, _ = model(src, lengths, prev)
    for h in hooks:
        h.remove()
    assert len(norms) == 2 * 2 + 2 * 3  # after every site, padded positions included, each token is unit
    for n in norms:
        torch.testing.assert_close(n, torch.ones_like(n), rtol=0, atol=1e-12)
    assert logits.abs().max() <= 1 + 1e-12  # |z_v| <= s_z_eff = 1: a near-uniform start


# ---- the weight projection ---------------------------------------------------------------------------------


def test_the_weights_are_projected_once_per_update_and_on_eval():
    model = build_model(ARCH, SHAPE, seed=1).train()
    src, lengths, prev = random_batch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model(src, lengths, prev)[0].square().mean().backward()
    optimizer.step()
    assert not unit_along_c(model)
    model.set_num_updates(1)  # what FairseqTask.train_step calls before the next forward
    assert unit_along_c(model)
    fc1 = model.decoder.layers[0].fc1.weight
    with torch.no_grad():
        fc1.mul_(2.0)
    before = fc1.clone()
    model.set_num_updates(1)  # the same n (--update-freq, the encoder's repeat call): nothing is redone
    assert torch.equal(fc1, before)
    model.eval()
    assert unit_along_c(model)
    with torch.no_grad():
        fc1.mul_(2.0)
    model.eval()  # already in eval mode: not a switch, nothing projected
    assert not unit_along_c(model)
    model.set_num_updates(2)
    assert unit_along_c(model)
    assert not any("sphere_weights" in k for k in model.state_dict())
    model.train()
    with torch.no_grad():
        fc1.mul_(2.0)
    ema = copy.deepcopy(model)  # as fairseq's EMA: the copy projects its own weights, not the original's
    ema.eval()
    assert unit_along_c(ema) and not unit_along_c(model)


# ---- decoding, training, checkpoints, precision ------------------------------------------------------------


def test_incremental_equals_full_and_the_cache_holds_unit_keys():
    model = perturbed(build_model(ARCH, SHAPE, seed=1)).double()
    src, lengths, prev = random_batch(model)
    full, incremental = full_and_incremental_logits(model, src, lengths, prev)
    torch.testing.assert_close(incremental, full, rtol=0, atol=1e-10)
    state: dict = {}
    with torch.no_grad():
        model.decoder(prev, encoder_out=model.encoder(src, src_lengths=lengths), incremental_state=state)
    attn = model.decoder.layers[0].self_attn
    keys = attn._get_input_buffer(state)["prev_key"]  # (batch, heads, time, d_h): each head's key is unit
    torch.testing.assert_close(keys.norm(dim=-1), torch.ones(keys.shape[:-1], dtype=keys.dtype), rtol=0, atol=1e-12)


def test_a_train_step_reaches_every_ngpt_parameter_and_a_checkpoint_round_trips():
    model = build_model(ARCH, SHAPE, seed=1).train()
    batch = random_batch(model)
    logits, _ = model(*batch)
    F.cross_entropy(logits.flatten(0, 1), batch[2].flatten()).backward()
    for name, p in model.named_parameters():
        if name.endswith(("alpha", "s_qk", "s_v", "s_z")):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    torch.optim.Adam(model.parameters(), lr=1e-2).step()
    model.set_num_updates(1)
    assert unit_along_c(model) and all(torch.isfinite(p).all() for p in model.parameters())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()  # already projected: the projection is idempotent bitwise (a loaded checkpoint computes the same)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    fresh = build_model(ARCH, SHAPE, seed=2)
    fresh.load_state_dict(torch.load(buffer), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(fresh(*batch)[0], model(*batch)[0], rtol=0, atol=0)


@pytest.mark.parametrize("flags", [["--value-residual", "both"], ["--tying", "value"]])
def test_it_composes_with_the_value_residual_and_value_tying(flags):
    """v_proj stays a bias-free Linear that the value residual wraps or tying shares: its weight is still found and
    projected, and the model decodes incrementally and round-trips like the plain one."""
    model = perturbed(build_model(ARCH, SHAPE + flags, seed=1)).train()
    model.set_num_updates(1)
    assert unit_along_c(model)
    matrices = {id(w) for side in (model.encoder, model.decoder) for w, _ in ngpt.stack_matrices(side)}
    assert matrices == {id(p) for p in model.parameters() if p.dim() == 2}
    batch = random_batch(model)
    full, incremental = full_and_incremental_logits(copy.deepcopy(model).double().eval(), *batch)
    torch.testing.assert_close(incremental, full, rtol=0, atol=1e-10)
    fresh = build_model(ARCH, SHAPE + flags, seed=2)
    fresh.load_state_dict(model.eval().state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(fresh(*batch)[0], model(*batch)[0], rtol=0, atol=0)


def test_checkpointed_layers_give_the_same_gradients():
    """The declaration ``activation_checkpointing = None``: the layers are functions of their inputs alone."""
    shape = ["--encoder-layers", "3", "--decoder-layers", "2", "--dropout", "0"]
    reference = perturbed(build_model(ARCH, shape)).train()
    checkpointed = build_model(ARCH, [*shape, "--checkpoint-activations"]).train()
    checkpointed.load_state_dict(reference.state_dict())
    batch = random_batch(reference)
    grads = [parameter_gradients(model, batch) for model in (reference, checkpointed)]
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_second_derivatives_of_the_update_and_the_qk_norms():
    """The declaration ``double_backward = None``: autograd's own ops, checked numerically in float64."""
    torch.manual_seed(0)
    site = ngpt.SphereUpdate(4).double()
    qk = ngpt.SphereQK(nn.Linear(4, 4, bias=False).double(), 2, query=True)
    x, h = torch.randn(2, 4, dtype=torch.float64, requires_grad=True), torch.randn(2, 4, dtype=torch.float64)
    assert torch.autograd.gradgradcheck(lambda x: site(x, h + x.flip(0)), (x,))
    assert torch.autograd.gradgradcheck(qk, (x,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_finite_at_e36d6(dtype):
    model = build_model("ngpt_e36d6", ["--dropout", "0"]).to(dtype).train()
    src, lengths, prev = random_batch(model)
    logits, _ = model(src, lengths, prev)
    loss = F.cross_entropy(logits.float().flatten(0, 1), prev.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.fixture(scope="module")
def lm_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_corpus")
    return binarize_lm(make_lm_corpus(root / "raw"), root / "bin")


def test_the_language_model_trains_projects_and_decodes_incrementally(lm_bin):
    model, task, args = build_lm(lm_bin, "ngpt_lm_d6")
    assert unit_along_c(model) and model.decoder.layer_norm is None
    criterion = task.build_criterion(args)
    model.train()
    loss, _, _ = criterion(model, train_batch(task))
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    assert math.isfinite(float(loss)) and not unit_along_c(model)
    model.set_num_updates(1)  # the LM keeps its family model outside its tree: the decoder gets the call
    assert unit_along_c(model)
    model.eval()
    assert_incremental_equals_full(model, task)


# ---- refusals ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flags, message", [
    (["--fp16"], "--fp16 cannot be used with --residual ngpt: fairseq's FP16Optimizer"),
    (["--bf16"], "--bf16 cannot be used with --residual ngpt: fairseq's FP16Optimizer"),
    (["--ddp-backend", "fully_sharded"], "--ddp-backend fully_sharded cannot be used with --residual ngpt"),
    (["--layernorm-embedding"], "--layernorm-embedding cannot be used with --residual ngpt"),
    (["--adaptive-softmax-cutoff", "5"], "--adaptive-softmax-cutoff cannot be used with --residual ngpt"),
    (["--quant-noise-pq", "0.1"], "--quant-noise-pq cannot be used with --residual ngpt"),
    (["--decoder-output-dim", "8"], "--decoder-output-dim other than --decoder-embed-dim cannot be used"),
])  # fmt: skip
def test_options_the_projection_cannot_serve_are_refused(flags, message):
    with pytest.raises(PluginOptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_model(ARCH, SHAPE + flags)


def test_memory_efficient_half_precision_is_accepted():
    build_model(ARCH, SHAPE + ["--fp16", "--memory-efficient-fp16"])


@pytest.mark.parametrize("flags, other", [
    (["--norm", "rmsnorm"], "--norm rmsnorm"),
    (["--tying", "key-query"], "--tying key-query"),
    (["--depth-aggregation", "denseformer"], "--depth-aggregation denseformer"),
    (["--depth-aggregation", "dca"], "--depth-aggregation dca"),
])  # fmt: skip
def test_combinations_it_cannot_make_are_refused_naming_both(flags, other):
    with pytest.raises(IncompatibleChoices) as info:
        build_model(ARCH, SHAPE + flags)
    assert "--residual ngpt" in str(info.value) and other in str(info.value)


@pytest.mark.parametrize("value", ["0", "2", "nan"])
def test_alpha_init_out_of_range_is_refused(value, capsys):
    with pytest.raises(SystemExit):
        parse_model_args(ARCH, ["--ngpt-alpha-init", value])
    assert "--ngpt-alpha-init must be" in capsys.readouterr().err


def test_its_options_are_refused_on_another_residual():
    with pytest.raises(PluginOptionError, match="--ngpt-alpha-scale applies only with --residual ngpt"):
        build_model("residual_axes", SHAPE + ["--residual", "pre", "--ngpt-alpha-scale", "0.5"])


def test_the_alpha_options_set_the_stored_scale_and_the_effective_init():
    model = build_model(ARCH, SHAPE + ["--ngpt-alpha-init", "0.2", "--ngpt-alpha-scale", "0.5"])
    site = model.decoder.layers[0].site_update["ffn"]
    assert torch.equal(site.alpha, torch.full_like(site.alpha, 0.5))
    torch.testing.assert_close(eff(site.alpha, site.init, site.scale), torch.full_like(site.alpha, 0.2))
