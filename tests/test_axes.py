"""The composed model ``residual_axes`` (fairseq_plugins/axes/, models/axes_transformer.py): with every axis off it
is fairseq's transformer; the family model names are aliases of it; refusals name both choices; the named
combinations build what their axes say."""

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_plugins.axes import IncompatibleChoices
from fairseq_plugins.models.axes_transformer import AxesTransformerModel
from fairseq_plugins.models.baselines import BASELINE_MODEL
from fairseq_plugins.models.families import ALIASES
from fairseq_plugins.models.presets import PRESETS
from fairseq_plugins.modules.cross_layer_guidance import TiedLinear
from fairseq_plugins.validation import PluginOptionError

from .helpers import build_model, parse_model_args, random_batch

SHAPE = ["--encoder-layers", "3", "--decoder-layers", "2"]


@pytest.mark.parametrize("residual", ["pre", "post"])
def test_with_every_axis_off_it_is_fairseqs_transformer(residual):
    baseline = build_model(f"transformer_{residual}ln_e6d6", SHAPE, seed=3)
    model = build_model("residual_axes", [*SHAPE, "--residual", residual], seed=3)
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in baseline.state_dict().items()}
    for key, value in baseline.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=0, atol=0, msg=key)
    batch = random_batch(model)
    with torch.no_grad():
        torch.testing.assert_close(model(*batch)[0], baseline(*batch)[0], rtol=0, atol=0)


def test_family_model_names_are_aliases_of_the_composed_model():
    for name, cls in ALIASES.items():
        assert issubclass(cls, AxesTransformerModel) and ARCH_MODEL_REGISTRY[name] is cls
    for arch, preset in PRESETS.items():
        if preset.model != BASELINE_MODEL:
            assert issubclass(ARCH_MODEL_REGISTRY[arch], AxesTransformerModel), arch


@pytest.mark.parametrize(("arch", "expected"), [
    ("residual_e6d6", {"residual": "resi-dual", "depth_aggregation": "none", "tying": "none"}),
    ("dca_k2_e6d6", {"residual": "pre", "depth_aggregation": "dca-k", "dca_k": 2}),
    ("laurel_pa_e6d6", {"depth_aggregation": "laurel-pa"}),
    ("hc_static_e6d6", {"depth_aggregation": "hc-static"}),
    ("crossformer_hg_value_e6d6", {"tying": "value", "guidance": "none"}),
    ("crossformer_sg_e6d6", {"tying": "none", "guidance": "key-query"}),
    ("crossformer_all_e16d6", {"tying": "all"}),
    ("tfixup_e12d6", {"residual": "tfixup", "norm": "layernorm"}),
])  # fmt: skip
def test_presets_set_the_axes(arch, expected):
    args = parse_model_args(arch)
    assert {k: getattr(args, k) for k in expected} == expected


def test_crossformer_hg_takes_a_comma_list_of_tied_blocks():
    """--tying (what crossformer_hg's --guidance named before issue 54; tests/test_crossformer.py holds --guidance)."""
    args = parse_model_args("crossformer_hg_e6d6", ["--tying", "key-query,ffn"])
    assert (args.tying, args.guidance) == ("key-query,ffn", "none")
    model = build_model("crossformer_hg_e6d6", ["--tying", "key-query,ffn", *SHAPE])
    blocks = {p.block for side in ("encoder", "decoder") for p in model.tied_pairs[side]}
    assert blocks == {"key-query", "ffn"}
    axes_model = build_model("residual_axes", ["--tying", "ffn,key-query", *SHAPE])  # the axis takes the list too
    assert {p.block for side in ("encoder", "decoder") for p in axes_model.tied_pairs[side]} == blocks
    count = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in axes_model.parameters()) == count


@pytest.mark.parametrize(("extra", "names"), [
    (["--residual", "resi-dual", "--depth-aggregation", "dca"], ("--residual resi-dual", "--depth-aggregation dca")),
    (["--residual", "post", "--depth-aggregation", "hc-dynamic"], ("--depth-aggregation hc-dynamic", "--residual post")),
    (["--residual", "tfixup", "--norm", "rmsnorm"], ("--residual tfixup", "--norm rmsnorm")),
    (["--depth-aggregation", "dca", "--norm", "rmsnorm"], ("--depth-aggregation dca", "--norm rmsnorm")),
])  # fmt: skip
def test_a_refused_pair_is_named_with_its_reason(extra, names):
    with pytest.raises(IncompatibleChoices) as err:
        build_model("residual_axes", [*SHAPE, *extra])
    message = str(err.value)
    assert message.startswith(f"{names[0]} cannot be combined with {names[1]}: ")


def test_an_unknown_choice_is_rejected_naming_the_option(capsys):
    with pytest.raises(SystemExit):
        parse_model_args("residual_axes", ["--depth-aggregation", "dense"])
    assert "--depth-aggregation must be one of none, dca" in capsys.readouterr().err
    args = parse_model_args("residual_axes")
    args.norm = "batchnorm"
    with pytest.raises(PluginOptionError, match="--norm must be one of layernorm, rmsnorm"):
        AxesTransformerModel.build_model(args, None)


def test_the_three_ideas_in_one_model():
    """Pre-LN + Crossformer key-query tying + DCA: GRNs in every layer, W_K(t) is W_Q(t+1)."""
    model = build_model("preln_kq_dca_e6d6", SHAPE)
    layers = model.encoder.layers
    assert all(hasattr(layer, "grn") for layer in layers)
    assert isinstance(layers[0].self_attn.k_proj, TiedLinear)
    assert layers[0].self_attn.k_proj.weight is layers[1].self_attn.q_proj.weight
    src, lengths, prev = random_batch(model)
    model.train()
    logits, _ = model(src, lengths, prev)
    logits.sum().backward()
    assert layers[1].self_attn.q_proj.weight.grad is not None


def test_rmsnorm_replaces_every_layernorm_keeping_the_names():
    model = build_model("residual_axes", [*SHAPE, "--norm", "rmsnorm"])
    assert not [n for n, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)]
    names = {n for n, _ in model.named_parameters()}
    assert "encoder.layers.0.self_attn_layer_norm.weight" in names
    assert "encoder.layers.0.self_attn_layer_norm.bias" not in names  # RMSNorm has no bias


def test_post_ln_wiring_composes_with_a_depth_stack():
    """DeepNet's layers (alpha-weighted Post-LN) under DenseFormer's depth-weighted averages."""
    model = build_model("deepnet_denseformer_e6d6", SHAPE)
    assert type(model.encoder.layers[0]).__name__ == "DeepNetEncoderLayer" and hasattr(model.encoder, "dwa")
