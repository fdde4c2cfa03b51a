"""Crossformer (sections 2.1-2.2): the guidance pairs of eq. 3, 5 and 6, soft guidance (the regularizer of
eq. 1 and the criterion of eq. 2), hard guidance (tied parameters), the parameter saving, decoding, and
fairseq's command-line tools."""

import io

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.criterions import build_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
)
from fairseq.logging import metrics
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

from fairseq_plugins.criterions.label_smoothed_cross_entropy_with_guidance import (
    LabelSmoothedCrossEntropyWithGuidanceCriterion,
)
from fairseq_plugins.modules.cross_layer_guidance import (
    BLOCKS,
    TiedLinear,
    expected_tied_parameter_saving,
    guidance_pairs,
    projections,
)
from fairseq_plugins.validation import STORED_ARGS, PluginOptionError

from .forkserver import run_forked
from .helpers import (
    TinyTask,
    build_model,
    full_and_incremental_logits,
    generate_command,
    hypotheses,
    parse_model_args,
    random_batch,
    train_command,
    train_log,
)
from .lm_helpers import save_checkpoint

ODD_EVEN = ["--encoder-layers", "5", "--decoder-layers", "4"]
HARD = ["--tying", "all", *ODD_EVEN]  # crossformer_hg: every block tied
SOFT = ["--guidance", "all", *ODD_EVEN]  # crossformer_sg: every block guided
CRITERION = ["--criterion", "label_smoothed_cross_entropy_with_guidance"]
N_TEST = 21  # sentences in the tiny corpus' test split
SHORT = ["--max-len-a", "1", "--max-len-b", "5"]  # an untrained model rarely stops: cap its output length


def every_pair(model):
    """(lower projection, upper projection, pair) for every tied pair (hard guidance) or else every guided pair
    (soft guidance) of encoder and decoder."""
    for stack in ("encoder", "decoder"):
        layers = getattr(model, stack).layers
        for pair in model.tied_pairs[stack] or model.guidance_pairs[stack]:
            yield (*projections(layers, pair), pair)


def make_sample(model):
    src, lengths, prev = random_batch(model)
    pad = model.decoder.dictionary.pad()
    target = torch.roll(prev, -1, dims=1)
    target[0, -2:] = pad  # padding is ignored by the loss
    net_input = {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}
    return {"net_input": net_input, "target": target, "ntokens": int(target.ne(pad).sum())}


def test_pairs_follow_equations_3_5_6_for_odd_and_even_depths():
    got = {(p.block, p.t, p.lower, p.upper) for p in guidance_pairs(5, BLOCKS)}
    kq, fc, v = "key-query", "ffn", "value"
    expected = {(kq, t, "self_attn.k_proj", "self_attn.q_proj") for t in (1, 2, 3, 4)}  # eq. 3: all but the top
    expected |= {(fc, t, "fc2", "fc2") for t in (1, 3)} | {(fc, t, "fc1", "fc1") for t in (2, 4)}  # eq. 5
    expected |= {(v, t, f"self_attn.{n}", f"self_attn.{n}") for t, n in [(1, "out_proj"), (3, "out_proj"),
                                                                         (2, "v_proj"), (4, "v_proj")]}  # eq. 6
    assert got == expected
    six = guidance_pairs(6, ["ffn"])  # eq. 5 as written: W1 at t = 2..T-2, W2 at t = 1..T-1
    assert [p.t for p in six if p.lower == "fc1"] == [2, 4] and [p.t for p in six if p.lower == "fc2"] == [1, 3, 5]
    assert guidance_pairs(1, BLOCKS) == []


def test_tied_parameters_are_one_parameter_with_the_summed_gradient():
    hg = build_model("crossformer_hg_e6d6", HARD).double()
    untied = build_model("crossformer_sg_e6d6", SOFT).double()  # same shape, nothing tied
    aliases = [name for name, m in hg.named_modules() if isinstance(m, TiedLinear)]
    assert len(aliases) == 3 * (4 + 3)
    # the untied model computes the same function when both projections of a pair hold the shared values
    missing = untied.load_state_dict(hg.state_dict(), strict=False).missing_keys
    assert sorted(missing) == sorted(f"{a}.{p}" for a in aliases for p in ("weight", "bias"))
    with torch.no_grad():
        for lower, upper, _ in every_pair(untied):
            lower.weight.copy_(upper.weight)
            lower.bias.copy_(upper.bias)
    for lower, upper, _ in every_pair(hg):
        assert lower.weight is upper.weight and lower.bias is upper.bias
        assert lower.weight.data_ptr() == upper.weight.data_ptr()

    batch = random_batch(hg)
    outputs = []
    for model in (hg, untied):
        logits, _ = model(*batch)
        logits.logsumexp(-1).mean().backward()
        outputs.append(logits)
    torch.testing.assert_close(outputs[0], outputs[1])
    for (_, owner, _), (lower, upper, pair) in zip(every_pair(hg), every_pair(untied), strict=True):
        torch.testing.assert_close(owner.weight.grad, lower.weight.grad + upper.weight.grad, msg=str(pair))
        torch.testing.assert_close(owner.bias.grad, lower.bias.grad + upper.bias.grad, msg=str(pair))

    params = list(hg.parameters())  # what fairseq's optimizers and fp16 flat buffers are built from
    assert len({id(p) for p in params}) == len(params)
    saving = sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in params)
    assert saving == expected_tied_parameter_saving(parse_model_args("crossformer_hg_e6d6", HARD))


def test_state_dict_round_trip_keeps_the_ties():
    hg = build_model("crossformer_hg_e6d6", HARD, seed=0)
    state = hg.state_dict()
    aliases = [name for name, m in hg.named_modules() if isinstance(m, TiedLinear)]
    assert not [a for a in aliases if f"{a}.weight" in state or f"{a}.bias" in state]
    assert "encoder.layers.0.self_attn.k_proj.weight" not in state  # W_K(1) is W_Q(2)
    assert "encoder.layers.4.self_attn.k_proj.weight" in state  # the top layer keeps its own W_K
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)

    other = build_model("crossformer_hg_e6d6", HARD, seed=1)
    other.load_state_dict(torch.load(buffer, weights_only=True), strict=True)
    for (lower, upper, pair), (_, saved, _) in zip(every_pair(other), every_pair(hg), strict=True):
        assert lower.weight is upper.weight and lower.bias is upper.bias, pair
        assert torch.equal(upper.weight, saved.weight), pair
    batch = random_batch(hg)
    torch.testing.assert_close(other(*batch)[0], hg(*batch)[0], rtol=0, atol=0)

    other.half()  # as --fp16 / --memory-efficient-fp16 do: converted once, still shared
    for lower, upper, _ in every_pair(other):
        assert lower.weight is upper.weight and upper.weight.dtype == torch.float16


# the paper's per-block accounting (section 2.2, d_ffn = 4 d_model): key-query 1 d^2, FFN 4 d^2, value 1 d^2,
# all 6 d^2, for each of the T-1 layers that has a partner above; plus the tied biases, counted in d
PER_BLOCK = {"key-query": 1, "ffn": 4, "value": 1, "all": 6}
# E36D6 has 35 + 5 pairs per block; biases: key-query/value d each; FFN: 18 + 3 W2 pairs (d), 17 + 2 W1 (4d)
BIASES = {"key-query": 40, "ffn": 21 + 4 * 19, "value": 40, "all": 40 + 21 + 4 * 19 + 40}


@pytest.mark.parametrize("tying", sorted(PER_BLOCK))
def test_parameter_saving_is_the_documented_formula_and_the_papers_accounting(tying):
    d = 16
    width = ["--encoder-ffn-embed-dim", str(4 * d), "--decoder-ffn-embed-dim", str(4 * d)]
    hg = build_model("crossformer_hg_e36d6", ["--tying", tying, *width])
    baseline = build_model("transformer_preln_e36d6", width)
    saving = sum(p.numel() for p in baseline.parameters()) - sum(p.numel() for p in hg.parameters())
    assert saving == expected_tied_parameter_saving(parse_model_args("crossformer_hg_e36d6", ["--tying", tying, *width]))
    assert saving == PER_BLOCK[tying] * d * d * (35 + 5) + BIASES[tying] * d
    assert expected_tied_parameter_saving(parse_model_args("crossformer_sg_e36d6")) == 0


@pytest.mark.parametrize("block", ["ffn", "value"])
def test_the_variant_presets_tie_their_tables_block_and_the_command_line_wins(block):
    """crossformer_hg_{ffn,value}_*: table 1's other rows by name, as --tying builds them."""
    by_name, by_option = build_model(f"crossformer_hg_{block}_e6d6"), build_model("crossformer_hg_e6d6", ["--tying", block])
    assert (by_name.args.tying, by_name.args.guidance) == (block, "none")
    assert [p.shape for p in by_name.parameters()] == [p.shape for p in by_option.parameters()]
    assert build_model(f"crossformer_hg_{block}_e6d6", ["--tying", "key-query"]).args.tying == "key-query"


def blocks_of(pairs: dict) -> set:
    return {p.block for side in ("encoder", "decoder") for p in pairs[side]}


def test_guidance_is_soft_guidance_on_the_crossformer_hg_presets_too():
    """--guidance means one thing (issue 54): on crossformer_hg_* it adds soft guidance to the preset's ties
    (before, it replaced the tied blocks)."""
    model = build_model("crossformer_hg_e6d6", ["--guidance", "ffn", *CRITERION])
    assert (model.args.tying, model.args.guidance) == ("key-query", "ffn")
    assert blocks_of(model.tied_pairs) == {"key-query"} and blocks_of(model.guidance_pairs) == {"ffn"}
    assert model.soft_guidance and float(model.guidance_loss()) > 0


def test_crossformer_hg_guidance_without_the_guidance_criterion_names_tying():
    """The old spelling of --tying on these presets (the older code refused the guidance criterion on them): one
    error, not a model tied otherwise than the command meant."""
    with pytest.raises(PluginOptionError, match=r"--guidance ffn with --arch crossformer_hg_e6d6: .* use --tying ffn$"):
        parse_model_args("crossformer_hg_e6d6", ["--guidance", "ffn"])
    with pytest.raises(PluginOptionError, match="names only the blocks that --tying ffn ties, whose soft guidance"):
        build_model("crossformer_hg_ffn_e6d6", ["--guidance", "ffn", *CRITERION])  # L_reg identically 0
    with pytest.raises(PluginOptionError, match="names only the blocks that --tying ffn ties"):
        build_model("residual_axes", ["--tying", "ffn", "--guidance", "ffn"])


@pytest.mark.parametrize("saved", ["before issue 26", "issue 26 to 54"])
def test_a_crossformer_hg_checkpoint_whose_guidance_named_the_tied_blocks_loads_tied(saved, tmp_path):
    """The older code stored the tied blocks in ``guidance`` (before issue 26 without ``tying``, since with the same
    blocks in it): fairseq rebuilds the model from those args tied as it was, with no soft guidance, and its weights
    load strictly and compute the same function."""
    arch = "crossformer_hg_e6d6"
    trained = build_model(arch, ["--tying", "ffn", *ODD_EVEN], seed=1)
    args = parse_model_args(arch, ["--tying", "ffn", *ODD_EVEN])
    args.guidance, args.tying = "ffn", (None if saved == "before issue 26" else "ffn")
    if args.tying is None:
        del args.tying
    state = checkpoint_utils.load_checkpoint_to_cpu(str(save_checkpoint(trained, args, tmp_path / "old.pt")))
    stored = state["cfg"]["model"]
    assert getattr(stored, STORED_ARGS, None) == []  # marked by the loader (checkpoint_safety.py)
    ARCH_CONFIG_REGISTRY[stored.arch](stored)  # as fairseq.models.build_model does
    loaded = ARCH_MODEL_REGISTRY[stored.arch].build_model(stored, TinyTask()).eval()
    assert (stored.tying, stored.guidance) == ("ffn", "none") and not loaded.soft_guidance
    assert blocks_of(loaded.tied_pairs) == {"ffn"}
    loaded.load_state_dict(state["model"], strict=True)
    batch = random_batch(trained)
    with torch.no_grad():
        torch.testing.assert_close(loaded(*batch)[0], trained.eval()(*batch)[0], rtol=0, atol=0)


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_regularizer_equals_a_hand_computation(norm):
    model = build_model("crossformer_sg_e6d6", ["--guidance", "all", "--guidance-norm", norm,
                                                "--encoder-layers", "3", "--decoder-layers", "2"]).double()  # fmt: skip
    enc, dec = model.encoder.layers, model.decoder.layers

    def state(layer, name):
        linear = layer.get_submodule(name)
        return torch.cat([linear.weight.flatten(), linear.bias])

    def size(x):
        return x.abs().sum() if norm == "l1" else x.pow(2).sum().sqrt()

    # (stack, t, projection of layer t, projection of layer t+1), from eq. 3, 5, 6; t is 1-based
    k, q, v, f = "self_attn.k_proj", "self_attn.q_proj", "self_attn.v_proj", "self_attn.out_proj"
    terms = [(enc, 1, k, q), (enc, 2, k, q), (enc, 1, "fc2", "fc2"), (enc, 2, "fc1", "fc1"), (enc, 1, f, f),
             (enc, 2, v, v), (dec, 1, k, q), (dec, 1, "fc2", "fc2"), (dec, 1, f, f)]  # fmt: skip
    expected = sum(size(state(s[t - 1], a) - state(s[t], b)) for s, t, a, b in terms)
    torch.testing.assert_close(model.guidance_loss(), expected, rtol=1e-12, atol=0)


def test_only_the_lower_layer_of_each_pair_gets_a_gradient():
    model = build_model("crossformer_sg_e6d6", SOFT)
    model.guidance_loss().backward()
    reached = {name for name, p in model.named_parameters() if p.grad is not None}
    lower = {f"{stack}.layers.{pair.t - 1}.{pair.lower}.{w}"
             for stack in ("encoder", "decoder") for pair in model.guidance_pairs[stack] for w in ("weight", "bias")}  # fmt: skip
    assert reached == lower  # no upper projection, no cross-attention, nothing else


@pytest.mark.parametrize("arch", ["crossformer_sg_e6d6", "crossformer_hg_e6d6"])
def test_incremental_equals_full_decoding(arch):
    model = build_model(arch, HARD if "_hg" in arch else SOFT)
    full, incremental = full_and_incremental_logits(model, *random_batch(model))
    torch.testing.assert_close(incremental, full, rtol=1e-5, atol=1e-5)


def run_criterion(criterion, model, sample):
    model.zero_grad()
    loss, sample_size, log = criterion(model, sample)
    loss.backward()
    return loss, sample_size, log, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_weight_zero_equals_label_smoothed_cross_entropy_exactly():
    task = TinyTask()
    model = build_model("crossformer_sg_e6d6", ["--guidance", "all"], task=task)
    sample = make_sample(model)
    reference = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    ours = LabelSmoothedCrossEntropyWithGuidanceCriterion(task, False, 0.1, guidance_weight=0.0)
    loss, size, log, grads = run_criterion(reference, model, sample)
    loss0, size0, log0, grads0 = run_criterion(ours, model, sample)
    assert torch.equal(loss0, loss) and size0 == size
    assert torch.equal(log0["loss"], log["loss"]) and torch.equal(log0["nll_loss"], log["nll_loss"])
    assert grads0.keys() == grads.keys() and all(torch.equal(grads0[n], g) for n, g in grads.items())
    torch.testing.assert_close(log0["guidance_loss"], model.guidance_loss().detach() * size)


def test_weight_adds_the_regularizer_per_target_token_and_logs_it():
    task = TinyTask()
    model = build_model("crossformer_sg_e6d6", ["--guidance", "all"], task=task)
    sample = make_sample(model)
    alpha = 0.5
    nll_loss, size, _, nll_grads = run_criterion(LabelSmoothedCrossEntropyCriterion(task, False, 0.1), model, sample)
    loss, _, log, grads = run_criterion(
        LabelSmoothedCrossEntropyWithGuidanceCriterion(task, False, 0.1, guidance_weight=alpha), model, sample
    )
    regularizer = model.guidance_loss().detach()
    torch.testing.assert_close(loss, nll_loss + alpha * size * regularizer)  # eq. 2 per target token
    for lower, upper, pair in every_pair(model):  # through the criterion too, the upper layer is not guided
        name = next(n for n, p in model.named_parameters() if p is upper.weight)
        assert torch.equal(grads[name], nll_grads[name]), pair
    with metrics.aggregate() as agg:
        LabelSmoothedCrossEntropyWithGuidanceCriterion.reduce_metrics([log])
    assert agg.get_smoothed_values()["guidance_loss"] == pytest.approx(regularizer.item(), abs=1e-4)


@pytest.mark.parametrize("option, value, message", [
    ("--guidance", "key-query,foo", "--guidance must be a comma-separated list of distinct items from key-query, ffn, value, all"),
    ("--guidance", "all,ffn", "'all' stands alone"),
    ("--guidance-norm", "l3", "--guidance-norm must be one of l1, l2"),
])  # fmt: skip
def test_bad_model_options_are_rejected_at_parse_time_and_by_build_model(option, value, message, capsys):
    with pytest.raises(SystemExit):
        parse_model_args("crossformer_sg_e6d6", [option, value])
    assert message in capsys.readouterr().err
    args = parse_model_args("crossformer_sg_e6d6")
    setattr(args, option[2:].replace("-", "_"), value)
    with pytest.raises(PluginOptionError, match=message):
        type(build_model("crossformer_sg_e6d6")).build_model(args, TinyTask())


def test_negative_guidance_weight_is_rejected_when_the_criterion_is_built():
    args = parse_model_args("crossformer_sg_e6d6", [*CRITERION, "--guidance-weight", "-0.1"])
    with pytest.raises(PluginOptionError, match=r"--guidance-weight must be in \[0, inf\), got -0.1"):
        build_criterion(args, TinyTask())


@pytest.mark.parametrize("arch", ["transformer_preln_e6d6", "crossformer_hg_e6d6"])
def test_criterion_refuses_a_model_without_guidance(arch):
    task = TinyTask()
    model = build_model(arch, task=task)
    criterion = LabelSmoothedCrossEntropyWithGuidanceCriterion(task, False, 0.1)
    with pytest.raises(PluginOptionError, match="needs a model with a guidance_loss"):
        criterion(model, make_sample(model))


def test_hard_guidance_refuses_fully_sharded_data_parallel():
    args = parse_model_args("crossformer_hg_e6d6", ["--ddp-backend", "fully_sharded"])
    with pytest.raises(PluginOptionError, match="--ddp-backend fully_sharded cannot be used with --tying key-query"):
        type(build_model("crossformer_hg_e6d6")).build_model(args, TinyTask())


def test_soft_guidance_trains_logs_the_regularizer_and_translates(corpus_bin, tmp_path):
    extra = [*CRITERION, "--guidance-weight", "0.01", "--guidance", "all", "--guidance-norm", "l1"]
    proc = run_forked(train_command(corpus_bin, tmp_path, "crossformer_sg_e6d6", max_update=4, extra=extra))
    records = train_log(proc.stdout) + train_log(proc.stdout, "valid")
    assert records and all(float(r.get("guidance_loss", r.get("valid_guidance_loss", 0))) > 0 for r in records)
    proc = run_forked(generate_command(corpus_bin, tmp_path / "checkpoint_last.pt", SHORT))
    assert sorted(hypotheses(proc.stdout)) == list(range(N_TEST))


def test_hard_guidance_trains_in_half_precision_keeps_the_ties_and_translates(corpus_bin, tmp_path):
    extra = [*HARD, "--memory-efficient-fp16"]
    proc = run_forked(train_command(corpus_bin, tmp_path, "crossformer_hg_e6d6", max_update=4, extra=extra))
    records = train_log(proc.stdout)
    assert records and all("loss_scale" in r for r in records)  # fairseq's half-precision optimizer ran
    state = torch.load(tmp_path / "checkpoint_last.pt", weights_only=True)["model"]
    assert "encoder.layers.0.self_attn.k_proj.weight" not in state and "decoder.layers.0.fc2.weight" not in state
    proc = run_forked(generate_command(corpus_bin, tmp_path / "checkpoint_last.pt", SHORT))
    assert sorted(hypotheses(proc.stdout)) == list(range(N_TEST))
    assert f"Translated {N_TEST} sentences" in proc.stdout + proc.stderr


def test_hard_guidance_e36d6_trains_with_the_documented_parameter_saving(corpus_bin, tmp_path):
    """fairseq-train --arch crossformer_hg_e36d6 reports exactly transformer_preln_e36d6's parameters minus the
    documented saving (tiny width, so a 36+6 layer model trains in seconds), and the model decodes."""
    import re

    proc = run_forked(train_command(corpus_bin, tmp_path, "crossformer_hg_e36d6", max_update=2))
    reported = int(re.search(r"num\. shared model params: ([\d,]+)", proc.stdout + proc.stderr)[1].replace(",", ""))
    task = _TaskOf(corpus_bin)
    baseline = sum(p.numel() for p in build_model("transformer_preln_e36d6", task=task).parameters())
    saving = expected_tied_parameter_saving(parse_model_args("crossformer_hg_e36d6"))
    assert saving > 0 and reported == baseline - saving
    proc = run_forked(generate_command(corpus_bin, tmp_path / "checkpoint_last.pt", SHORT))
    assert sorted(hypotheses(proc.stdout)) == list(range(N_TEST))


class _TaskOf:
    """The dictionaries of a binarized corpus (joined: one dictionary for both sides)."""

    def __init__(self, data_dir):
        from fairseq.data import Dictionary

        self.source_dictionary = self.target_dictionary = Dictionary.load(str(data_dir / "dict.src.txt"))
