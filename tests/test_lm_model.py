"""The language models' construction: the preset table, the options a user can give, fairseq's own
``transformer_lm`` as the baseline, and the families whose decoder-only form differs from their translation
decoder (DeepNet's constants, Admin's profiling pass)."""

import pytest
import torch
from fairseq import tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_plugins.lm import LM_FAMILIES, LM_PRESETS
from fairseq_plugins.lm.decoder_only import deepnet_decoder_only_constants
from fairseq_plugins.lm.presets import (
    LM_ALSO_KEPT,
    LM_DEPTHS,
    LM_KEPT_DEPTHS,
    LM_SWEPT_FAMILIES,
    LM_WIDTHS,
)
from fairseq_plugins.models import PRESETS
from fairseq_plugins.validation import PluginOptionError

from .helpers import parse_model_args
from .lm_helpers import (
    binarize_lm,
    build_lm,
    make_lm_corpus,
    parse_lm_args,
    train_batch,
)

POST_LN = ("admin", "b2t", "deepnet", "residual", "tfixup", "transformer_postln")


@pytest.fixture(scope="module")
def lm_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_corpus")
    return binarize_lm(make_lm_corpus(root / "raw", sizes=(("train", 40), ("valid", 8), ("test", 8))), root / "bin")


def test_every_family_has_every_width_at_the_kept_depths():
    """Every family at every width and the kept depths, DCA figure 6's models at every depth (lm/presets.py;
    tests/test_arch_names.py checks the names against their users)."""
    assert set(LM_FAMILIES) == {p.family for p in PRESETS.values()}
    for family in LM_FAMILIES:
        for width in LM_WIDTHS:
            for depth in LM_DEPTHS:
                arch = f"{family}_lm_{width}d{depth}"
                kept = depth in LM_KEPT_DEPTHS or (family in LM_SWEPT_FAMILIES and width == "") or arch in LM_ALSO_KEPT
                assert (arch in LM_PRESETS) == (arch in ARCH_MODEL_REGISTRY) == kept, arch
                if kept:
                    preset = LM_PRESETS[arch]
                    assert (preset.family, preset.layers, preset.width) == (family, depth, LM_WIDTHS[width])


@pytest.mark.parametrize("arch, shape", [
    ("dca_lm_d12", (12, 512, 2048, 8, "relu")),
    ("hc_dynamic_lm_gpt_d24", (24, 768, 3072, 12, "gelu")),
    ("residual_lm_big_d6", (6, 1024, 4096, 16, "relu")),
])  # fmt: skip
def test_presets_set_the_shape_and_the_command_line_wins(lm_bin, arch, shape):
    args = parse_lm_args(lm_bin, arch, tiny=False)
    got = (args.decoder_layers, args.decoder_embed_dim, args.decoder_ffn_embed_dim, args.decoder_attention_heads,
           args.activation_fn)  # fmt: skip
    assert got == shape
    assert parse_lm_args(lm_bin, arch, ["--decoder-layers", "3"], tiny=False).decoder_layers == 3


@pytest.mark.parametrize("family", sorted(LM_FAMILIES))
def test_the_family_keeps_its_layer_norm_position(lm_bin, family):
    # fairseq's base_lm_architecture forces Pre-LN; an LM's decoder must stay what the family's translation one is
    args = parse_lm_args(lm_bin, f"{family}_lm_d6")
    translation = parse_model_args(LM_FAMILIES[family].translation_arch)
    assert args.decoder_normalize_before is bool(translation.decoder_normalize_before)
    assert args.no_cross_attention
    if family in POST_LN:
        assert not args.decoder_normalize_before


def test_options_are_the_lm_and_family_ones(lm_bin):
    args = parse_lm_args(lm_bin, "dca_lm_d6", ["--dca-mode", "grn-v1", "--add-bos-token"])
    assert args.dca_mode == "grn-v1" and args.add_bos_token
    with pytest.raises(SystemExit):  # a translation-only option is not an LM option
        parse_lm_args(lm_bin, "dca_lm_d6", ["--encoder-layers", "3"])
    # another family's option is an LM option exactly where it is one of the family's translation arch
    try:
        parse_model_args(LM_FAMILIES["dca"].translation_arch, ["--hc-rate", "2"])
    except SystemExit:
        with pytest.raises(SystemExit):
            parse_lm_args(lm_bin, "dca_lm_d6", ["--hc-rate", "2"])
    else:
        assert parse_lm_args(lm_bin, "dca_lm_d6", ["--hc-rate", "2"]).hc_rate == 2
    with pytest.raises(PluginOptionError, match="decoder-normalize-before"):  # the family's own checks run
        build_lm(lm_bin, "deepnet_lm_d6", ["--decoder-normalize-before"])
    with pytest.raises(PluginOptionError, match="decoder-layers-to-keep"):  # not supported yet, said so
        build_lm(lm_bin, "residual_lm_d6", ["--decoder-layers-to-keep", "0,2"])


def _fairseq_lm(data, arch: str):
    """fairseq's own LM as fairseq-train builds it: through the hydra config, which is where the dataclass
    model ``transformer_lm`` takes its defaults from (its input/output dims do not follow --decoder-embed-dim
    there: given explicitly)."""
    args = parse_lm_args(data, arch, ["--decoder-input-dim", "16", "--decoder-output-dim", "16"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    return task.build_model(cfg.model).eval()


@pytest.mark.parametrize("ours, theirs", [
    # fairseq's named LM archs run base_lm_architecture: Pre-LN with a final LayerNorm
    ("transformer_preln_lm_big_d6", "transformer_lm_big"),
    # fairseq's plain transformer_lm takes the dataclass defaults: Post-LN, no final LayerNorm
    ("transformer_postln_lm_d6", "transformer_lm"),
])  # fmt: skip
def test_transformer_families_equal_fairseq_transformer_lm(lm_bin, ours, theirs):
    model, task, _ = build_lm(lm_bin, ours)
    baseline = _fairseq_lm(lm_bin, theirs)
    assert type(baseline).__name__ == "TransformerLanguageModel"
    baseline.load_state_dict(model.state_dict())
    tokens = train_batch(task)["net_input"]["src_tokens"]
    with torch.no_grad():
        torch.testing.assert_close(model(tokens)[0], baseline(tokens)[0], atol=0, rtol=0)


def test_deepnet_uses_the_decoder_only_constants(lm_bin):
    model, _, args = build_lm(lm_bin, "deepnet_lm_d6", ["--decoder-embed-dim", "64", "--decoder-ffn-embed-dim", "64"])
    m = args.decoder_layers
    constants = deepnet_decoder_only_constants(m)
    assert constants["alpha"] == pytest.approx((2 * m) ** 0.25) and constants["beta"] == pytest.approx((8 * m) ** -0.25)
    for layer in model.decoder.layers:
        assert layer.alpha == pytest.approx(constants["alpha"])
        # xavier_normal(gain=beta): std = beta * sqrt(2 / (fan_in + fan_out)), measured on fc1 (64 x 64)
        assert float(layer.fc1.weight.std()) == pytest.approx(constants["beta"] * (2 / 128) ** 0.5, rel=0.1)


def test_only_admin_profiles(lm_bin):
    assert not build_lm(lm_bin, "dca_lm_d6")[0].profiles_admin


def test_admin_profiles_on_its_first_training_batch_only(lm_bin):
    model, task, _ = build_lm(lm_bin, "admin_lm_d6")
    omega = [layer.omega_init.clone() for layer in model.decoder.layers]
    assert all(bool((w == 1).all()) for w in omega) and not bool(model.admin_profiled)
    assert "admin_profiled" in model.state_dict()
    model.train()
    batch = train_batch(task)["net_input"]
    model(**batch)
    profiled = [layer.omega_init.clone() for layer in model.decoder.layers]
    assert bool(model.admin_profiled) and not all(bool((w == 1).all()) for w in profiled[1:])
    model(**batch)
    assert all(torch.equal(a, b) for a, b in zip(profiled, [la.omega_init for la in model.decoder.layers], strict=True))


def test_crossformer_hg_ties_the_decoder_pairs(lm_bin):
    model, _, _ = build_lm(lm_bin, "crossformer_hg_lm_d6")
    layers = model.decoder.layers
    # key-query pairs: the lower layer's W_K is the upper layer's W_Q, one Parameter
    assert layers[0].self_attn.k_proj.weight is layers[1].self_attn.q_proj.weight
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == len({id(p) for p in model.parameters()})


def test_adaptive_input_and_softmax_as_fairseqs_wikitext_lm(lm_bin):
    cutoffs = ["--adaptive-input", "--adaptive-input-cutoff", "10,20", "--adaptive-softmax-cutoff", "10,20",
               "--tie-adaptive-weights", "--adaptive-input-factor", "2", "--adaptive-softmax-factor", "2"]  # fmt: skip
    model, task, _ = build_lm(lm_bin, "dca_lm_d6", cutoffs)
    assert type(model.decoder.embed_tokens).__name__ == "AdaptiveInput" and model.decoder.adaptive_softmax is not None
    with torch.no_grad():
        features, _ = model(train_batch(task)["net_input"]["src_tokens"], features_only=True)
    assert torch.isfinite(features).all()


@pytest.mark.parametrize("arch", ["dca_lm_d6", "transformer_preln_lm_d6"])
def test_autocast_dtype_reaches_the_decoder(lm_bin, arch):
    # the family's own --autocast-dtype (fairseq_plugins/precision.py) is an LM option too and wraps the decoder;
    # the fairseq-transformer baseline has it as well (fairseq_plugins/models/baselines.py)
    model, task, _ = build_lm(lm_bin, arch, ["--autocast-dtype", "bfloat16"])
    assert model.decoder.autocast_dtype is torch.bfloat16
    with torch.no_grad():
        logits, _ = model(train_batch(task)["net_input"]["src_tokens"])
    assert logits.dtype is torch.float32 and torch.isfinite(logits).all()


def test_hybrid_norm_star_makes_the_first_decoder_layer_pre_ln(lm_bin):
    """--hybrid-first-layer pre in a decoder-only model: only layer 0 gets the attention input norm."""
    model, _, _ = build_lm(lm_bin, "hybridnorm_lm_d6", ["--hybrid-first-layer", "pre"])
    layers = model.decoder.layers
    assert layers[0].pre_ln_ffn and not any(layer.pre_ln_ffn for layer in layers[1:])
    assert [k for k in model.state_dict() if "self_attn_layer_norm" in k] == [
        "decoder.layers.0.self_attn_layer_norm.weight", "decoder.layers.0.self_attn_layer_norm.bias"
    ]
