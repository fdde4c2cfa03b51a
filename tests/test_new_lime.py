"""LIMe, ``--depth-aggregation lime`` (modules/lime.py, axes/aggregation_streams.LIMe): the routed keys and values
against a float64 re-implementation of the equations, the initial routes, incremental and beam decoding against
full passes (translation and language model), a train step, the checkpoint, half precision and the refusals."""

import copy
import io
import math

import pytest
import torch
from fairseq import tasks
from fairseq.sequence_generator import SequenceGenerator
from torch import nn

from fairseq_plugins.axes import RESIDUALS, IncompatibleChoices
from fairseq_plugins.modules.lime import LimeProjection
from fairseq_plugins.validation import PluginOptionError

from .helpers import build_model, full_and_incremental_logits, random_batch
from .lm_helpers import parse_lm_args

SHAPE = ["--encoder-layers", "4", "--decoder-layers", "4", "--dropout", "0"]
HEADS = 2  # tests/helpers.TINY


def lime(extra=(), seed=0, arch="lime_e6d6"):
    return build_model(arch, [*SHAPE, *extra], seed=seed)


def perturb_(model, seed=3, scale=0.05):
    """Move every parameter off its init (the routes off their identity block), deterministically."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def self_attentions(stack):
    return [layer.self_attn for layer in stack.layers]


def tiny_lm(tmp_path, extra=(), seed=0):
    (tmp_path / "dict.txt").write_text("".join(f"w{i} 1\n" for i in range(20)))
    args = parse_lm_args(tmp_path, "lime_lm_d6", ["--decoder-layers", "4", "--dropout", "0", *extra])
    torch.manual_seed(seed)
    return tasks.setup_task(args).build_model(args).eval()


def record_stack(attentions):
    """Hooks recording each self-attention's input and its k_proj/v_proj outputs; returns (records, handles)."""
    records = [{} for _ in attentions]
    handles = []
    for rec, attn in zip(records, attentions, strict=True):
        handles.append(attn.register_forward_pre_hook(
            lambda m, a, kw, rec=rec: rec.update(x=kw.get("query", a[0] if a else None)), with_kwargs=True))
        for name in ("k_proj", "v_proj"):
            handles.append(getattr(attn, name).register_forward_hook(
                lambda m, i, o, rec=rec, name=name: rec.update({name: o})))  # fmt: skip
    return records, handles


def reference_mix(attentions, records, name):
    """K'_l (or V'_l) in float64 from the equations: sum over layers j <= l and heads r of W_l[h, jH + r] K_{j,r}
    (one product over the concatenated sources, unlike the module's per-source sum)."""
    raws = []
    out = []
    for layer, (attn, rec) in enumerate(zip(attentions, records, strict=True)):
        proj = getattr(attn, name)
        x = rec["x"].double()
        raw = x @ proj.weight.double().T + proj.bias.double()
        t, b, c = raw.shape
        raws.append(raw.reshape(t, b, HEADS, c // HEADS))
        if layer == 0:
            out.append(raw)
            continue
        w = proj.scale * attn.lime_routes.double()
        out.append(torch.einsum("hs,tbsd->tbhd", w, torch.cat(raws, dim=2)).reshape(t, b, c))
    return out


def check_stack_against_equations(attentions, records):
    for name in ("k_proj", "v_proj"):
        expected = reference_mix(attentions, records, name)
        for layer, rec in enumerate(records):
            torch.testing.assert_close(rec[name], expected[layer], rtol=1e-12, atol=1e-12)


def test_keys_and_values_are_routed_as_the_equations_in_every_stack(tmp_path):
    model = perturb_(lime().double())
    stacks = [self_attentions(model.encoder), self_attentions(model.decoder)]
    recorded = [record_stack(a) for a in stacks]
    with torch.no_grad():
        model(*random_batch(model))
    for attentions, (records, handles) in zip(stacks, recorded, strict=True):
        for h in handles:
            h.remove()
        check_stack_against_equations(attentions, records)
        assert attentions[0].k_proj.routes is None and not hasattr(attentions[0], "lime_routes")  # layer 0 plain
    for layer in model.decoder.layers:  # cross-attention untouched
        assert type(layer.encoder_attn.k_proj) is nn.Linear and type(layer.encoder_attn.v_proj) is nn.Linear
    lm = perturb_(tiny_lm(tmp_path).double())
    attentions = self_attentions(lm.decoder)
    records, handles = record_stack(attentions)
    with torch.no_grad():
        lm.decoder(torch.randint(4, 20, (2, 5)))
    for h in handles:
        h.remove()
    check_stack_against_equations(attentions, records)


def test_attention_output_uses_the_routed_keys_and_values():
    """One decoder layer's self-attention output recomputed from its queries and the routed K', V'."""
    model = perturb_(lime().double())
    attn = model.decoder.layers[2].self_attn
    seen = {}
    attn.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    attn.register_forward_hook(lambda m, a, kw, o: seen.update(out=o[0]), with_kwargs=True)
    for name in ("k_proj", "v_proj"):
        getattr(attn, name).register_forward_hook(lambda m, i, o, name=name: seen.update({name: o}))
    with torch.no_grad():
        model(*random_batch(model))
    x = seen["query"]
    t, b, c = x.shape
    d = c // HEADS
    q = (attn.q_proj(x) * d**-0.5).reshape(t, b, HEADS, d)
    k, v = (seen[n].reshape(t, b, HEADS, d) for n in ("k_proj", "v_proj"))
    logits = torch.einsum("tbhd,sbhd->bhts", q, k) + seen["attn_mask"]
    out = torch.einsum("bhts,sbhd->tbhd", logits.softmax(-1), v).reshape(t, b, c)
    torch.testing.assert_close(seen["out"], attn.out_proj(out), rtol=1e-6, atol=1e-6)  # fairseq's float32 softmax


@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_initial_routes_are_the_authors_static_router(scale):
    model = lime(["--lime-router-lr-scale", str(scale)], seed=4)
    for attentions in (self_attentions(model.encoder), self_attentions(model.decoder)):
        for layer, attn in enumerate(attentions):
            if layer == 0:
                assert attn.k_proj.effective_routes() is None
                continue
            w = attn.k_proj.effective_routes()
            assert attn.v_proj.routes is attn.lime_routes is attn.k_proj.routes  # one W_l for keys and values
            assert w.shape == (HEADS, (layer + 1) * HEADS)
            torch.testing.assert_close(w[:, layer * HEADS :], torch.eye(HEADS), rtol=0, atol=1e-6)
            bound = math.sqrt(3 / ((layer + 1) * HEADS))
            others = w[:, : layer * HEADS]
            assert others.abs().max() <= bound and others.abs().max() > bound / 10
    reference = lime(["--lime-router-lr-scale", "1"], seed=4)
    torch.testing.assert_close(model.decoder.layers[3].self_attn.k_proj.effective_routes(),
                               reference.decoder.layers[3].self_attn.k_proj.effective_routes(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("scale", "tol"), [("8", 1e-12), ("10", 1e-6)])  # 1/10 is not a float32: I/10 * 10 != I
def test_identity_init_is_the_model_without_lime(scale, tol):
    with_lime = lime(["--lime-init", "identity", "--lime-router-lr-scale", scale], seed=2).double()
    without = lime(["--depth-aggregation", "none"], seed=2).double()
    for side in ("encoder", "decoder"):  # both through fairseq's unfused path (its fused one softmaxes in float64)
        for attn in self_attentions(getattr(without, side)):
            attn._set_skip_embed_dim_check()
    assert with_lime.decoder.layers[1].self_attn.lime_routes.abs().sum() > 0  # the own block only
    batch = random_batch(with_lime)
    with torch.no_grad():
        torch.testing.assert_close(with_lime(*batch)[0], without(*batch)[0], rtol=tol, atol=tol)


def test_the_store_is_empty_after_a_pass_and_recovers_from_an_exception():
    model = perturb_(lime().double())
    batch = random_batch(model)
    store = model.decoder.layers[0].self_attn.k_proj.store
    with torch.no_grad():
        expected = model(*batch)[0]
    assert store == {"k": [], "v": []}

    def fail(*_):
        raise KeyboardInterrupt

    handle = model.decoder.layers[2].self_attn.q_proj.register_forward_hook(fail)
    with pytest.raises(KeyboardInterrupt), torch.no_grad():
        model(*batch)
    handle.remove()
    assert len(store["k"]) == 2  # left by the interrupted pass
    with torch.no_grad():
        torch.testing.assert_close(model(*batch)[0], expected, rtol=0, atol=0)
    assert store == {"k": [], "v": []}


def test_incremental_equals_full_and_the_cache_holds_the_routed_keys():
    model = perturb_(lime().double())
    src, lengths, prev = random_batch(model)
    full, incremental = full_and_incremental_logits(model, src, lengths, prev)
    torch.testing.assert_close(incremental, full, rtol=1e-6, atol=1e-6)  # fairseq softmaxes attention in float32
    attn = model.decoder.layers[3].self_attn
    routed = {}
    handle = attn.k_proj.register_forward_hook(lambda m, i, o: routed.update(k=o))
    state: dict = {}
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        model.decoder(prev, encoder_out=encoder_out)
        full_keys = routed["k"]
        for t in range(prev.size(1)):
            model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
    handle.remove()
    cached = attn._get_input_buffer(state)["prev_key"]  # (batch, heads, steps, d_h)
    t, b, _ = full_keys.shape
    torch.testing.assert_close(cached, full_keys.reshape(t, b, HEADS, -1).permute(1, 2, 0, 3), rtol=1e-12, atol=1e-12)


def test_beam_search_scores_equal_a_full_pass():
    """Beam search reorders the cache of routed K'/V': each hypothesis's step scores equal one full pass's."""
    model = perturb_(lime().double(), scale=0.2)
    src, lengths, _ = random_batch(model)
    generator = SequenceGenerator([model], model.decoder.dictionary, beam_size=3, max_len_a=0, max_len_b=6)
    with torch.no_grad():
        hyps = generator.generate([model], {"net_input": {"src_tokens": src, "src_lengths": lengths}})
        eos = model.decoder.dictionary.eos()
        for i, beams in enumerate(hyps):
            for hyp in beams:
                tokens = hyp["tokens"].unsqueeze(0)
                prev = torch.cat([torch.tensor([[eos]]), tokens[:, :-1]], dim=1)
                logits, _ = model(src[i : i + 1], lengths[i : i + 1], prev)
                scores = logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)[0]
                torch.testing.assert_close(hyp["positional_scores"], scores.float(), rtol=1e-5, atol=1e-5)
    assert model.decoder.layers[0].self_attn.k_proj.store == {"k": [], "v": []}


def test_language_model_incremental_equals_full(tmp_path):
    lm = perturb_(tiny_lm(tmp_path).double())
    tokens = torch.randint(4, 20, (3, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full, _ = lm.decoder(tokens)
        state: dict = {}
        steps = [lm.decoder(tokens[:, : t + 1], incremental_state=state)[0] for t in range(tokens.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-6, atol=1e-6)


def test_a_train_step_moves_the_routes_c_times_faster():
    """Under Adam the first step moves every stored entry by lr, so the used routes W = c P by c lr."""
    model = lime(["--lime-router-lr-scale", "10"]).train()
    src, lengths, prev = random_batch(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    logits, _ = model(src, lengths, prev)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), prev.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    routes = [a.lime_routes for a in self_attentions(model.decoder)[1:] + self_attentions(model.encoder)[1:]]
    assert all(r.grad is not None and r.grad.abs().sum() > 0 for r in routes)
    assert model.encoder.layers[0].self_attn.k_proj.weight.grad.abs().sum() > 0
    before = model.decoder.layers[3].self_attn.k_proj.effective_routes().detach().clone()
    optimizer.step()
    step = (model.decoder.layers[3].self_attn.k_proj.effective_routes().detach() - before).abs()
    torch.testing.assert_close(step.max(), torch.tensor(1e-2), rtol=1e-3, atol=0)


def test_checkpoint_round_trip_keeps_the_state_dict_names():
    model = perturb_(lime(seed=1))
    baseline = lime(["--depth-aggregation", "none"])
    keys, base = set(model.state_dict()), set(baseline.state_dict())
    added = {f"{side}.layers.{i}.self_attn.lime_routes" for side in ("encoder", "decoder") for i in (1, 2, 3)}
    assert keys == base | added
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    fresh = lime(seed=2)
    fresh.load_state_dict(torch.load(buffer))
    batch = random_batch(model)
    with torch.no_grad():
        torch.testing.assert_close(fresh(*batch)[0], model(*batch)[0], rtol=0, atol=0)
    copied = copy.deepcopy(model)  # the projections' reference follows the copy's registered routes
    attn = copied.decoder.layers[2].self_attn
    assert attn.k_proj.routes is attn.lime_routes is not model.decoder.layers[2].self_attn.lime_routes


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_finite_at_e36d6(dtype):
    model = build_model("lime_e36d6", ["--dropout", "0"]).to(dtype).train()
    src, lengths, prev = random_batch(model)
    logits, _ = model(src, lengths, prev)
    loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), prev.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("residual", ["deepnet", "b2t", "tfixup"])
def test_residual_inits_treat_the_projections_as_linears_and_leave_the_routes(residual):
    model = lime(["--residual", residual])
    for layer, attn in enumerate(self_attentions(model.decoder)):
        assert isinstance(attn.k_proj, LimeProjection) and isinstance(attn.k_proj, nn.Linear)
        if layer:
            torch.testing.assert_close(attn.k_proj.effective_routes()[:, layer * HEADS :], torch.eye(HEADS),
                                       rtol=0, atol=1e-6)  # fmt: skip


@pytest.mark.parametrize(("extra", "names"), [
    (["--residual", "resi-dual"], ("--depth-aggregation lime", "--residual resi-dual")),
    (["--residual", "hybrid"], ("--depth-aggregation lime", "--residual hybrid")),
    (["--residual", "ngpt"], ("--depth-aggregation lime", "--residual ngpt")),
    (["--tying", "key-query"], ("--depth-aggregation lime", "--tying key-query")),
    (["--tying", "value"], ("--depth-aggregation lime", "--tying value")),
    (["--tying", "all"], ("--depth-aggregation lime", "--tying all")),
])  # fmt: skip
def test_refusals_name_both_choices(extra, names):
    if extra[0] == "--residual" and extra[1] not in RESIDUALS:
        pytest.skip(f"--residual {extra[1]} is not in this tree")
    with pytest.raises(IncompatibleChoices) as err:
        lime(extra)
    message = str(err.value)
    assert names[0] in message and names[1] in message and " cannot be combined with " in message


@pytest.mark.parametrize(("extra", "message"), [
    (["--value-residual", "both"], "--value-residual both cannot be combined with --depth-aggregation lime: "),
    (["--value-residual", "decoder"], "--value-residual decoder cannot be combined with --depth-aggregation lime: "),
    (["--encoder-layerdrop", "0.1"], "--encoder-layers-to-keep cannot be used with --depth-aggregation lime: "),
    (["--decoder-layers-to-keep", "0,1"], "--decoder-layerdrop and --decoder-layers-to-keep cannot be used with "),
    (["--checkpoint-activations"], "--checkpoint-activations cannot be used with --depth-aggregation lime: "),
    (["--depth-aggregation", "none", "--lime-init", "identity"], "--lime-init applies only with --depth-agg"),
    (["--depth-aggregation", "none", "--lime-router-lr-scale", "2"], "--lime-router-lr-scale applies only with "),
])  # fmt: skip
def test_option_refusals(extra, message):
    with pytest.raises(PluginOptionError, match=message):
        lime(extra)


@pytest.mark.parametrize(("extra", "message"), [
    (["--lime-router-lr-scale", "0"], "--lime-router-lr-scale must be in (0, 1000], got 0"),
    (["--lime-router-lr-scale", "1e4"], "--lime-router-lr-scale must be in (0, 1000], got 10000"),
    (["--lime-init", "bad"], "--lime-init"),
])  # fmt: skip
def test_option_values_are_validated(extra, message, capsys):
    with pytest.raises((SystemExit, PluginOptionError)):
        lime(extra)
    assert message in capsys.readouterr().err
