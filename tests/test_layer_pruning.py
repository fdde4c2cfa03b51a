"""Layer pruning (fairseq's --encoder-layers-to-keep / --decoder-layers-to-keep) keeps, for every kept layer,
exactly the weights it was trained with, including Crossformer-HG's tied projections; what cannot be pruned
is refused with a clear error; per axis choice of ``residual_axes`` too (as each choice declares in ``prunes``),
over each choice alone and a sample of combinations (tests/grid_sample.py; the whole grid with ALL_FAMILIES=1). The CLI paths
(fairseq-generate --model-overrides, fairseq-train --restore-file) are in tests/test_fairseq_parity.py."""

import copy
import io
import re

import pytest
import torch
from torch import nn

from fairseq_plugins.axes import tables
from fairseq_plugins.axes.aggregation import DCA
from fairseq_plugins.axes.grid import AXES
from fairseq_plugins.modules.cross_layer_guidance import TiedLinear
from fairseq_plugins.validation import PluginOptionError

from .grid_sample import axis_flags, choice_sample, combo_id
from .helpers import TinyTask, build_model, parse_model_args, random_batch

TASK = TinyTask()
# 5 encoder layers (odd and even t), 3 decoder layers; every block guided, so all of eq. 3, 5, 6 are tied
SHAPE = ["--encoder-layers", "5", "--decoder-layers", "3", "--tying", "all"]


def projections(layer: nn.Module) -> dict[str, nn.Module]:
    """Every linear projection of a layer, tied or not: name -> module with .weight/.bias."""
    return {name: m for name, m in layer.named_modules(remove_duplicate=False) if isinstance(m, nn.Linear | TiedLinear)}


def effective_weights(layer: nn.Module) -> dict[str, torch.Tensor]:
    return {f"{n}.{p}": getattr(m, p).detach().clone() for n, m in projections(layer).items() for p in ("weight", "bias")
            if getattr(m, p) is not None}  # a projection without a bias (nGPT's) has no bias to compare  # fmt: skip


def saved_state(model) -> dict:
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def trained(arch: str, shape=SHAPE):
    """A model whose tied weights all differ (as after training), so a wrong partner cannot go unnoticed."""
    model = build_model(arch, shape, task=TASK)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model


def pruned_from(state: dict, arch: str, encoder_keep: str, decoder_keep: str, extra=(), shape=SHAPE):
    """Build a pruned model from the command line (the list form fairseq-train parses) and load ``state``
    through fairseq's own path: upgrade_state_dict, prune_state_dict, strict load."""
    args = parse_model_args(arch, [*shape, *extra, "--encoder-layers-to-keep", encoder_keep,
                                   "--decoder-layers-to-keep", decoder_keep])  # fmt: skip
    torch.manual_seed(1)
    model = type_of(arch).build_model(args, TASK).eval()
    model.load_state_dict(state, strict=True, model_cfg=args)
    return model, args


def type_of(arch: str):
    from fairseq.models import ARCH_MODEL_REGISTRY

    return ARCH_MODEL_REGISTRY[arch]


def assert_kept_layers_equal(pruned, full, side: str, keep: list[int]):
    for new, old in enumerate(keep):
        got = effective_weights(getattr(pruned, side).layers[new])
        want = effective_weights(getattr(full, side).layers[old])
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), f"{side} layer {old} (now {new}): {name}"


@pytest.mark.parametrize("arch", ["crossformer_hg_e6d6", "crossformer_all_e16d6"])
def test_pruned_hard_guidance_keeps_every_kept_layers_own_weights(arch):
    full = trained(arch)
    state = saved_state(full)  # the saved format: each shared weight once, under its owner
    assert "encoder.layers.0.self_attn.k_proj.weight" not in state
    enc_keep, dec_keep = [0, 2, 3], [1]
    pruned, args = pruned_from(state, arch, "0,2,3", "1")
    assert_kept_layers_equal(pruned, full, "encoder", enc_keep)
    assert_kept_layers_equal(pruned, full, "decoder", dec_keep)
    assert args.encoder_layers_to_keep is None  # fairseq resets it once pruned; the record stays
    assert args.guidance_encoder_layer_ids == "0,2,3" and args.guidance_decoder_layer_ids == "1"

    enc = pruned.encoder.layers
    # old layers 2 and 3 stay adjacent: their pair (t = 3, odd: W_K~W_Q, W2, W_F) is still one Parameter
    assert enc[1].self_attn.k_proj.weight is enc[2].self_attn.q_proj.weight
    assert enc[1].fc2.weight is enc[2].fc2.weight and enc[1].self_attn.out_proj.weight is enc[2].self_attn.out_proj.weight
    # old layer 0 lost its partner (old layer 1): its projections are its own again, not old layer 2's
    assert isinstance(enc[0].self_attn.k_proj, nn.Linear) and isinstance(enc[0].fc2, nn.Linear)
    assert not isinstance(enc[1].fc1, TiedLinear)  # t = 3 is odd: W1 is not in a pair (eq. 5)
    n_params = sum(p.numel() for p in pruned.parameters())
    assert len({id(p) for p in pruned.parameters()}) == len(list(pruned.parameters()))
    assert n_params < sum(p.numel() for p in full.parameters())

    # the pruned model saves and reloads by itself: its args carry the kept layers' original numbers
    rebuilt = type_of(arch).build_model(copy.deepcopy(args), TASK).eval()
    rebuilt.load_state_dict(saved_state(pruned), strict=True, model_cfg=args)
    batch = random_batch(pruned)
    torch.testing.assert_close(rebuilt(*batch)[0], pruned(*batch)[0], rtol=0, atol=0)
    assert rebuilt.encoder.layers[1].self_attn.k_proj.weight is rebuilt.encoder.layers[2].self_attn.q_proj.weight

    # pruning a pruned model composes: its layers 1, 2 are the original 2, 3, still a tied pair
    again = copy.deepcopy(args)
    again.encoder_layers_to_keep = "1,2"
    twice = type_of(arch).build_model(again, TASK).eval()
    twice.load_state_dict(saved_state(pruned), strict=True, model_cfg=again)
    assert again.guidance_encoder_layer_ids == "2,3"
    assert_kept_layers_equal(twice, full, "encoder", [2, 3])
    assert twice.encoder.layers[0].self_attn.k_proj.weight is twice.encoder.layers[1].self_attn.q_proj.weight


def test_unpruned_load_is_unchanged_and_lost_prune_records_are_refused():
    full = trained("crossformer_hg_e6d6")
    other = build_model("crossformer_hg_e6d6", SHAPE, seed=3, task=TASK)
    other.load_state_dict(saved_state(full), strict=True)
    batch = random_batch(full)
    torch.testing.assert_close(other(*batch)[0], full(*batch)[0], rtol=0, atol=0)

    # a pruned model's checkpoint loaded without its record would tie layers trained apart: an error
    pruned, _ = pruned_from(saved_state(full), "crossformer_hg_e6d6", "0,2,3", "1")
    plain = build_model("crossformer_hg_e6d6", ["--encoder-layers", "3", "--decoder-layers", "1", "--tying", "all"],
                        task=TASK)  # fmt: skip
    with pytest.raises(RuntimeError, match="tied to .* but the checkpoint holds two different values"):
        plain.load_state_dict(saved_state(pruned), strict=True)


@pytest.mark.parametrize("arch", ["crossformer_sg_e6d6", "residual_e6d6", "transformer_preln_e6d6"])
def test_families_without_ties_prune_like_fairseq(arch):
    shape = [*SHAPE[:4], "--guidance", "all"] if arch.startswith("crossformer") else SHAPE[:4]  # soft: nothing tied
    full = trained(arch, shape)
    args = parse_model_args(arch, [*shape, "--encoder-layers-to-keep", "0,2,3", "--decoder-layers-to-keep", "1"])
    if arch.startswith("transformer_"):
        args.encoder_layers_to_keep, args.decoder_layers_to_keep = "0,2,3", "1"  # fairseq's own build needs the string
    pruned = type_of(arch).build_model(args, TASK).eval()
    pruned.load_state_dict(saved_state(full), strict=True, model_cfg=args)
    assert_kept_layers_equal(pruned, full, "encoder", [0, 2, 3])
    assert_kept_layers_equal(pruned, full, "decoder", [1])
    if arch.startswith("crossformer_sg"):  # the regularizer pairs only layers that were adjacent
        assert [p.t for p in pruned.guidance_pairs["encoder"]] == [2, 2, 2] and not pruned.guidance_pairs["decoder"]


def test_bad_layers_to_keep_are_refused_by_name():
    for value, match in [("0,7", "--encoder-layers-to-keep must name distinct layers in 0..4"),
                         ("1,1", "distinct"), ("a,b", "comma-separated layer numbers")]:  # fmt: skip
        args = parse_model_args("crossformer_hg_e6d6", SHAPE)
        args.encoder_layers_to_keep = value  # as --model-overrides sets it (argparse already refuses 'a,b')
        with pytest.raises(PluginOptionError, match=match):
            type_of("crossformer_hg_e6d6").build_model(args, TASK)
    args = parse_model_args("residual_e6d6", ["--decoder-layers", "2"])
    args.decoder_layers_to_keep = "2"
    with pytest.raises(PluginOptionError, match="--decoder-layers-to-keep .*model-overrides"):
        type_of("residual_e6d6").build_model(args, TASK)


@pytest.mark.parametrize("arch", ["dca_e6d6", "dca_k2_e6d6"])
def test_dca_refuses_pruning_in_training_and_as_a_load_time_override(arch):
    with pytest.raises(PluginOptionError, match="--encoder-layerdrop and --encoder-layers-to-keep cannot be used"):
        build_model(arch, ["--encoder-layers-to-keep", "0,2"], task=TASK)
    args = parse_model_args(arch)
    args.decoder_layers_to_keep = "1"  # as --model-overrides sets it on a saved checkpoint's args
    with pytest.raises(PluginOptionError, match="--decoder-layerdrop and --decoder-layers-to-keep cannot be used"):
        type_of(arch).build_model(args, TASK)



def test_parameters_keep_the_owners_order_and_names():
    # optimizer states (Adam's moments) are matched to parameters by position: a shared Parameter must keep
    # the owner's place and name, as in checkpoints saved before TiedLinear registered it
    hg = build_model("crossformer_all_e16d6", [*SHAPE[:4], "--share-all-embeddings"], task=TASK)
    seen, expected = set(), []
    for name, value in hg.state_dict(keep_vars=True).items():  # TiedLinear saves nothing: the owners' order
        if isinstance(value, nn.Parameter) and id(value) not in seen:
            seen.add(id(value))
            expected.append(name)
    assert [name for name, _ in hg.named_parameters()] == expected
    assert "encoder.layers.1.self_attn.q_proj.weight" in expected and "encoder.layers.0.self_attn.k_proj.weight" not in expected


def layer_state(layer: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in layer.state_dict().items()}


@pytest.mark.parametrize("arch", ["tfixup_e6d6", "b2t_e6d6", "admin_e6d6", "normformer_e6d6"])
def test_wiring_baselines_prune_like_fairseq_keeping_every_layers_state(arch):
    # their forwards read nothing from the depth (T-Fixup's and B2T's depth-scaled inits only set the starting
    # weights, which the checkpoint replaces); Admin's omegas (omega_init buffer, omega_delta) are per layer
    full = trained(arch, SHAPE[:4])
    if arch.startswith("admin"):  # as after profiling: every layer's omega_init its own
        full.admin_profiled.fill_(True)
        for layer in [*full.encoder.layers, *full.decoder.layers]:
            layer.omega_init.normal_()
    pruned, _ = pruned_from(saved_state(full), arch, "0,2,3", "1", shape=SHAPE[:4])
    for side, keep in (("encoder", [0, 2, 3]), ("decoder", [1])):
        assert len(getattr(pruned, side).layers) == len(keep)
        for new, old in enumerate(keep):
            got, want = layer_state(getattr(pruned, side).layers[new]), layer_state(getattr(full, side).layers[old])
            assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), (side, old)
    if arch.startswith("admin"):  # the loaded omegas are kept: no re-profiling on the pruned model's first batch
        assert bool(pruned.admin_profiled) and any("omega_init" in k for k in layer_state(pruned.encoder.layers[0]))


# the legacy families (a model of their own before issue 26) whose choice declares it refuses pruning; DCA has its
# own test above
DEPTH_INDEXED = [f"{c.preset}_e6d6" for table in tables().values() for c in table.values()
                 if c.prunes and getattr(c, "family", "") and not issubclass(c, DCA)]  # fmt: skip


@pytest.mark.parametrize("arch", DEPTH_INDEXED)
def test_depth_dependent_families_refuse_pruning_in_training_and_as_a_load_time_override(arch):
    # DeepNet: alpha, a forward constant, follows both depths; the depth-aggregation families own weights sized
    # and indexed by a layer's position in the stack
    match = "layers-to-keep cannot be used with"
    with pytest.raises(PluginOptionError, match=f"--encoder-{match}"):
        build_model(arch, ["--encoder-layers-to-keep", "0,2"], task=TASK)
    args = parse_model_args(arch)
    args.decoder_layers_to_keep = "1"  # as --model-overrides sets it on a saved checkpoint's args
    with pytest.raises(PluginOptionError, match=f"--decoder-{match}"):
        type_of(arch).build_model(args, TASK)


def refusal(choice) -> str | None:
    """What the PluginOptionError naming --encoder/--decoder-layers-to-keep says for a choice alone, from its
    declaration (``prunes``: None = fairseq's pruning keeps every kept layer's weights, else the reason)."""
    if choice.prunes is None:
        return None
    return f"cannot be used with {choice.who()}: {choice.prunes}"


# per axis choice of residual_axes, as declared. A combination prunes when all its choices do; else the first
# refusing choice in axis order is named (docs/grid.md lists each choice's reason)
PRUNING: dict[str, dict[str, str | None]] = {
    axis: {name: refusal(choice) for name, choice in table.items()} for axis, table in tables().items()
}
SAMPLE = choice_sample()


def test_every_axis_choice_states_what_pruning_does():
    undeclared = [c.label() for table in tables().values() for c in table.values() if not isinstance(c.prunes, str | None)]
    assert not undeclared, f"declare prunes (None or the reason) on these choices: {undeclared}"


@pytest.mark.parametrize("combo", SAMPLE, ids=[combo_id(c) for c in SAMPLE])
def test_axis_combinations_prune_or_refuse_as_their_choices_say(combo):
    shape = [*SHAPE[:4], *axis_flags(combo)]
    refused = next((PRUNING[axis][combo[axis]] for axis in AXES if PRUNING[axis][combo[axis]]), None)
    if refused:
        with pytest.raises(PluginOptionError, match=r"--encoder-layers-to-keep .*" + re.escape(refused)):
            build_model("residual_axes", [*shape, "--encoder-layers-to-keep", "0,2"], task=TASK)
        args = parse_model_args("residual_axes", shape)
        args.decoder_layers_to_keep = "1"  # as --model-overrides sets it on a saved checkpoint's args
        with pytest.raises(PluginOptionError, match=r"--decoder-layers-to-keep .*" + re.escape(refused)):
            type_of("residual_axes").build_model(args, TASK)
        return
    full = trained("residual_axes", shape)
    pruned, _ = pruned_from(saved_state(full), "residual_axes", "0,2,3", "1", shape=shape)
    assert (len(pruned.encoder.layers), len(pruned.decoder.layers)) == (3, 1)
    assert_kept_layers_equal(pruned, full, "encoder", [0, 2, 3])
    assert_kept_layers_equal(pruned, full, "decoder", [1])
    with torch.no_grad():
        assert torch.isfinite(pruned(*random_batch(pruned))[0]).all()
