"""--autocast-dtype (fairseq_plugins/precision.py) on CPU autocast: every family trains and decodes in bfloat16 with
float32 weights, LayerNorm statistics, depth mixing and logits; the default leaves every model as it was."""

import math

import pytest
import torch

from fairseq_plugins import precision
from fairseq_plugins.models import PRESETS
from fairseq_plugins.modules.grn import GRN
from fairseq_plugins.validation import PluginOptionError

from .forkserver import run_forked
from .grid_sample import choice_families
from .helpers import (
    build_model,
    close_in_bf16,
    full_and_incremental_logits,
    generate_command,
    hypotheses,
    random_batch,
    train_command,
)

# two layers a side: the families' arithmetic at a fraction of the E6D6 cost
SHALLOW = ["--encoder-layers", "2", "--decoder-layers", "2"]
BF16 = ["--autocast-dtype", "bfloat16"]
# one preset per family, the shallowest depth it has (crossformer_all only exists as E16D6); every family but a
# combination of choices other families hold (tests/grid_sample.py: its modules, and what autocast does to them, are
# theirs), every family with ALL_FAMILIES=1
_SHALLOWEST = {p.family: a for a, p in reversed(PRESETS.items()) if "iwslt" not in a}
FAMILY_ARCHS = sorted(_SHALLOWEST[family] for family in choice_families(_SHALLOWEST))


def train_updates(model, steps: int = 3) -> list[float]:
    """A few Adam updates on a fixed random batch (label-smoothed NLL as fairseq computes it)."""
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    src, lengths, prev = random_batch(model, seed=1)
    target = torch.roll(prev, -1, dims=1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        net_output = model(src, lengths, prev)
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        assert net_output[0].dtype == torch.float32 and lprobs.dtype == torch.float32
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).mean()
        loss = 0.9 * nll - 0.1 * lprobs.mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def build_bf16(arch: str):
    """``arch`` with --autocast-dtype bfloat16 on the command line (the fairseq-transformer baselines too)."""
    return build_model(arch, SHALLOW + BF16)


@pytest.mark.parametrize("arch", FAMILY_ARCHS)
def test_every_family_trains_and_decodes_in_bf16_autocast(arch):
    model = build_bf16(arch)
    losses = train_updates(model)
    assert all(math.isfinite(x) for x in losses), losses
    params = list(model.parameters())
    assert all(p.dtype == torch.float32 for p in params)
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in params)
    model.eval()
    src, lengths, prev = random_batch(model)
    full, incremental = full_and_incremental_logits(model, src, lengths, prev)
    assert full.dtype == incremental.dtype == torch.float32
    assert close_in_bf16(incremental, full)


def test_autocast_runs_products_in_bf16_and_sensitive_parts_in_float32():
    model = build_model("dca_e6d6", SHALLOW + BF16)
    seen: dict[str, set] = {"linear": set(), "layer_norm": set(), "grn_in": set()}

    def record(kind, tensor):
        seen[kind].add(tensor.dtype)

    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_hook(lambda _m, _i, out: record("linear", out))
        elif isinstance(m, torch.nn.LayerNorm):
            m.register_forward_hook(lambda _m, _i, out: record("layer_norm", out))
        elif isinstance(m, GRN):
            m.register_forward_hook(lambda _m, _i, out: record("grn_in", out[0] if isinstance(out, tuple) else out))
    full32 = build_model("dca_e6d6", SHALLOW)
    src, lengths, prev = random_batch(model)
    full, _ = full_and_incremental_logits(model, src, lengths, prev)
    reference, _ = full_and_incremental_logits(full32, src, lengths, prev)
    assert seen["linear"] == {torch.bfloat16}
    assert seen["layer_norm"] == {torch.float32}
    assert seen["grn_in"] == {torch.float32}
    assert not torch.equal(full, reference) and close_in_bf16(full, reference)  # autocast really ran


def test_autocast_float32_attribute_is_the_extension_point():
    class Sinkhorn(torch.nn.Module):
        autocast_float32 = True

        def forward(self, x):
            return torch.exp(x @ x.transpose(-1, -2))

    model = build_model("transformer_preln_e6d6", SHALLOW)
    model.decoder.sinkhorn = Sinkhorn()
    precision.enable_autocast(model, torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.decoder.sinkhorn(torch.randn(3, 4).bfloat16()).dtype == torch.float32


def test_baselines_take_the_option_and_match_fairseqs_transformer_under_it():
    """transformer_preln/postln_* accept --autocast-dtype; in bf16 they compute what fairseq's own transformer does
    when enable_autocast wraps it (the same weights at the same seed, the same outputs)."""
    from fairseq.models.transformer import TransformerModel

    for arch in ("transformer_preln_e6d6", "transformer_postln_iwslt_e6d6"):
        mixed = build_model(arch, SHALLOW + BF16)
        assert isinstance(mixed.encoder, precision.AutocastForward) and mixed.encoder.autocast_dtype == torch.bfloat16
        plain = build_model(arch, SHALLOW)
        own = precision.enable_autocast(TransformerModel(plain.args, plain.encoder, plain.decoder), torch.bfloat16)
        assert {k: v.shape for k, v in mixed.state_dict().items()} == {k: v.shape for k, v in own.state_dict().items()}
        own.load_state_dict(mixed.state_dict())
        mixed.eval(), own.eval()
        batch = random_batch(mixed)
        with torch.no_grad():
            torch.testing.assert_close(mixed(*batch)[0], own(*batch)[0], rtol=0, atol=0)


def test_default_leaves_the_model_as_it_was():
    for arch in ("transformer_preln_e6d6", "dca_e6d6", "deepnet_e6d6"):
        model = build_model(arch, SHALLOW)
        assert not any(isinstance(m, (precision.AutocastForward, precision.Float32Forward)) for m in model.modules())


def test_state_dict_is_the_same_with_and_without_autocast():
    plain = build_model("residual_e6d6", SHALLOW)
    mixed = build_model("residual_e6d6", SHALLOW + BF16)
    a, b = plain.state_dict(), mixed.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("bad", ["bf16", "float32", "half"])
def test_bad_dtype_is_rejected_naming_the_option(bad):
    with pytest.raises(SystemExit):  # argparse prints the PluginOptionError's message and exits
        build_model("residual_e6d6", ["--autocast-dtype", bad])
    with pytest.raises(PluginOptionError, match="--autocast-dtype must be one of none, bfloat16, float16"):
        precision.check_autocast_dtype("autocast_dtype", bad)


@pytest.mark.parametrize("flag", ["--fp16", "--memory-efficient-fp16", "--amp"])
def test_fairseq_precision_flags_clash(flag):
    with pytest.raises(PluginOptionError, match=f"cannot be used with .*{flag}"):
        build_model("residual_e6d6", SHALLOW + BF16 + [flag])


def test_fp16_training_is_unchanged():
    """--fp16 casts the model to half; the plugin leaves that path alone (no autocast, no float32 wrappers)."""
    model = build_model("residual_e6d6", SHALLOW + ["--fp16"]).half()
    assert not isinstance(model.decoder, precision.AutocastForward)
    src, lengths, prev = random_batch(model)
    assert model(src, lengths, prev)[0].dtype == torch.float16


def test_fairseq_train_and_generate_with_autocast_bf16(corpus_bin, tmp_path):
    """The command line of docs/gpu.md, on CPU: the option is parsed, saved, and applied again by fairseq-generate
    (each a process of its own, forked from tests/forkserver.py's server: generate reads only the checkpoint)."""
    arch = "dca_k2_e6d6"
    run_forked(train_command(corpus_bin, tmp_path, arch, max_update=3, extra=SHALLOW + BF16))
    checkpoint = tmp_path / "checkpoint_last.pt"
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert saved["cfg"]["model"].autocast_dtype == "bfloat16"
    out = run_forked(generate_command(corpus_bin, checkpoint, ["--beam", "2"]))
    assert len(hypotheses(out.stdout)) == 21
