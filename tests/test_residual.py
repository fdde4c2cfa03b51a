"""ResiDual (arXiv:2304.14802, section 2.2 and appendix H.3) checked against a direct re-implementation of
its equations in float64, plus the FP16 dual-branch downscaling."""


import pytest
import torch

from fairseq_plugins.validation import PluginOptionError

from .equations import attention, ffn, layer_norm
from .helpers import build_model, parameter_gradients, parse_model_args, random_batch


def resi_dual(x, blocks, stream):
    """x^d_1 = s x_1; for each sub-block f_k: x^d += s f_k(x_k), x_{k+1} = LN(x_k + f_k(x_k));
    y = x_{N+1} + LN(x^d_{N+1})."""
    s = stream.scale
    dual = s * x
    for f, norm in blocks:
        fx = f(x)
        dual = dual + s * fx
        x = layer_norm(x + fx, norm)
    return x + layer_norm(dual, stream.layer_norm)


def reference_forward(model, src, lengths, prev):
    enc_layers, dec_layers = model.encoder.layers, model.decoder.layers
    src_pad = src.eq(model.encoder.padding_idx)
    x, _ = model.encoder.forward_embedding(src)  # the scaled, position-embedded embedding (dropout off)
    x = x.masked_fill(src_pad.unsqueeze(-1), 0).transpose(0, 1)
    blocks = []
    for layer in enc_layers:
        blocks += [
            (lambda x, a=layer.self_attn: attention(x, x, x, a, src_pad), layer.self_attn_layer_norm),
            (lambda x, layer=layer: ffn(x, layer), layer.final_layer_norm),
        ]
    memory = resi_dual(x, blocks, model.encoder.dual_stream)

    d = model.decoder
    y = d.embed_scale * d.embed_tokens(prev) + d.embed_positions(prev)
    y = y.transpose(0, 1)
    blocks = []
    for layer in dec_layers:
        blocks += [
            (lambda x, a=layer.self_attn: attention(x, x, x, a, causal=True), layer.self_attn_layer_norm),
            (lambda x, a=layer.encoder_attn: attention(x, memory, memory, a, src_pad), layer.encoder_attn_layer_norm),
            (lambda x, layer=layer: ffn(x, layer), layer.final_layer_norm),
        ]
    return resi_dual(y, blocks, d.dual_stream).transpose(0, 1)


@pytest.mark.parametrize("scale", ["1.0", "0.05"])
def test_forward_matches_the_equations(scale):
    model = build_model("residual_e6d6", ["--encoder-layers", "3", "--decoder-layers", "2",
                                          "--dual-residual-scale", scale]).double()  # fmt: skip
    src, lengths, prev = random_batch(model, batch=3, src_len=6, tgt_len=5)
    with torch.no_grad():
        # non-trivial LayerNorm parameters, so that every LN of the equations is exercised
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.add_(0.1 * torch.randn_like(p))
        features, _ = model(src, lengths, prev, features_only=True)
        expected = reference_forward(model, src, lengths, prev)
    # fairseq's attention takes its softmax in float32 (utils.softmax), hence not 1e-12
    torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-6)


def test_dual_stream_layer_norm_uses_the_authors_epsilon():
    model = build_model("residual_e6d6")
    assert model.encoder.dual_stream.layer_norm.eps == 1e-7
    assert model.decoder.dual_stream.layer_norm.eps == 1e-7
    # ResiDual's layers are Post-LN; the dual LayerNorm replaces fairseq's final one
    assert model.encoder.layer_norm is None and model.decoder.layer_norm is None


def test_scale_leaves_the_output_unchanged():
    """LN(s * x) = LN(x): the scale changes the dual stream's magnitude, not the model."""
    src_model = build_model("residual_e6d6")
    scaled = build_model("residual_e6d6", ["--dual-residual-scale", "0.05"])
    scaled.load_state_dict(src_model.state_dict())
    batch = random_batch(src_model)
    with torch.no_grad():
        expected, _ = src_model(*batch)
        got, _ = scaled(*batch)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def deep_model_with_large_branches(scale: str):
    """E36D6 whose FFN outputs carry a fixed +-2000 pattern, so the dual stream grows by 2000 per layer:
    36 layers reach 72,000 > 65,504, the largest half-precision number."""
    model = build_model("residual_e36d6", ["--dual-residual-scale", scale])
    sign = torch.randint(0, 2, (16,), generator=torch.Generator().manual_seed(0)).float() * 2 - 1
    with torch.no_grad():
        for layer in model.encoder.layers:
            layer.fc2.bias.copy_(2000 * sign)
    return model


def test_fp16_dual_stream_overflows_unscaled_and_stays_finite_scaled():
    batch = random_batch(build_model("residual_e6d6"))
    reference = deep_model_with_large_branches("1.0")
    with torch.no_grad():
        expected, _ = reference(*batch, features_only=True)  # float32
        assert torch.isfinite(expected).all()

        unscaled_out, _ = reference.half()(*batch, features_only=True)
        scaled = deep_model_with_large_branches("0.05").half()
        dual_peaks = []
        scaled.encoder.end_layers = lambda x, dual: (
            dual_peaks.append(dual.abs().max().item()) or type(scaled.encoder).end_layers(scaled.encoder, x, dual)
        )
        scaled_out, _ = scaled(*batch, features_only=True)

    assert not torch.isfinite(unscaled_out).all(), "the unscaled dual stream should overflow in fp16"
    assert 0.05 * 36 * 2000 * 0.9 < dual_peaks[0] < 65504, dual_peaks
    assert torch.isfinite(scaled_out).all()
    torch.testing.assert_close(scaled_out.float(), expected, rtol=0, atol=2e-2)


@pytest.mark.parametrize("bad", ["0", "-0.5", "1.5", "nan", "abc"])
def test_bad_dual_residual_scale_is_rejected_at_parse_time(bad, capsys):
    with pytest.raises(SystemExit):
        parse_model_args("residual_e6d6", ["--dual-residual-scale", bad])
    err = capsys.readouterr().err
    assert "--dual-residual-scale" in err and "(0, 1]" in err or "number" in err


def test_bad_dual_residual_scale_is_rejected_by_build_model():
    args = parse_model_args("residual_e6d6")
    args.dual_residual_scale = 2.0
    from .helpers import TinyTask

    with pytest.raises(PluginOptionError, match=r"--dual-residual-scale must be in \(0, 1\], got 2"):
        type(build_model("residual_e6d6")).build_model(args, TinyTask())


def test_pre_ln_switch_is_rejected():
    with pytest.raises(PluginOptionError, match="--encoder-normalize-before cannot be used"):
        build_model("residual_e6d6", ["--encoder-normalize-before"])


def test_activation_checkpointing_gives_the_same_gradients():
    """The dual stream's increment is a layer output, so fairseq's checkpoint_wrapper recomputes it."""
    grads = []
    for extra in ([], ["--checkpoint-activations"]):
        model = build_model("residual_e6d6", extra, seed=3).train()
        torch.manual_seed(0)  # same dropout masks in both runs
        grads.append(parameter_gradients(model, random_batch(model)))
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, msg=name)
