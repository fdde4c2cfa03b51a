"""Properties over random small configurations of every family and of the axes grid's working combinations
(seeded hypothesis search; fairseq_plugins/axes/grid.py):
incremental == full decoding, each sentence's output independent of its batch and of left or right
source padding, and state_dict save/load round trips."""

import io

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairseq_plugins.axes.grid import combinations, refusal
from fairseq_plugins.models import PRESETS

from .helpers import build_model, full_and_incremental_logits, random_batch

FAMILIES = sorted({p.family for p in PRESETS.values() if f"{p.family}_e6d6" in PRESETS})
GRID = [c for c in combinations() if refusal(c) is None]
# fairseq takes attention's softmax in float32 even in a float64 model, hence 1e-5 and not 1e-12
TOL = {"rtol": 1e-5, "atol": 1e-5}
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])  # fmt: skip


@st.composite
def configurations(draw):
    if draw(st.booleans()):  # a family's preset, or a working combination of the axes
        arch, axes = f"{draw(st.sampled_from(FAMILIES))}_e6d6", []
    else:
        combo = draw(st.sampled_from(GRID))
        arch, axes = "residual_axes", [f for a, n in combo.items() for f in ("--" + a.replace("_", "-"), n)]
    heads = draw(st.sampled_from([1, 2, 4]))
    dim = heads * draw(st.sampled_from([4, 8]))  # sinusoidal positions need dim >= 4
    least = 2 if arch == "dca_k2_e6d6" else 1  # k = 2 needs a stack of 2 layers (check_dca_args)
    args = ["--encoder-layers", str(draw(st.integers(least, 4))), "--decoder-layers", str(draw(st.integers(1, 4))),
            "--encoder-embed-dim", str(dim), "--decoder-embed-dim", str(dim),
            "--encoder-ffn-embed-dim", str(draw(st.sampled_from([4, 16, 32]))),
            "--decoder-ffn-embed-dim", str(draw(st.sampled_from([4, 16, 32]))),
            "--encoder-attention-heads", str(heads), "--decoder-attention-heads", str(heads)]  # fmt: skip
    return arch, [*args, *axes], draw(st.integers(0, 2**16))


def build(config):
    arch, args, seed = config
    model = build_model(arch, args, seed=seed, tiny=False)
    with torch.no_grad():  # move LayerNorms and biases off their initial values
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
    return model.double()


@SETTINGS
@given(configurations())
def test_incremental_equals_full(config):
    model = build(config)
    full, incremental = full_and_incremental_logits(model, *random_batch(model, seed=config[2]))
    torch.testing.assert_close(incremental, full, **TOL)


def right_pad(src, pad):
    """Move each row's left padding to the right."""
    out = torch.full_like(src, pad)
    for i, row in enumerate(src):
        tokens = row[row.ne(pad)]
        out[i, : len(tokens)] = tokens
    return out


@SETTINGS
@given(configurations())
def test_each_sentence_is_independent_of_its_batch_and_padding(config):
    model = build(config)
    src, lengths, prev = random_batch(model, batch=3, src_len=7, seed=config[2])
    pad = model.encoder.dictionary.pad()
    with torch.no_grad():
        batched, _ = model(src, lengths, prev)
        right, _ = model(right_pad(src, pad), lengths, prev)
        alone = [model(src[i : i + 1, src.size(1) - int(n) :], lengths[i : i + 1], prev[i : i + 1])[0]
                 for i, n in enumerate(lengths)]  # fmt: skip
    torch.testing.assert_close(torch.cat(alone), batched, **TOL)
    torch.testing.assert_close(right, batched, **TOL)


@SETTINGS
@given(configurations())
def test_state_dict_round_trip(config):
    model = build(config)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict()}, buffer)
    buffer.seek(0)
    arch, args, seed = config
    fresh = build_model(arch, args, seed=seed + 1, tiny=False).double()
    fresh.load_state_dict(torch.load(buffer, weights_only=True)["model"], strict=True)
    batch = random_batch(model, seed=seed)
    with torch.no_grad():
        torch.testing.assert_close(fresh(*batch)[0], model(*batch)[0], rtol=0, atol=0)
