"""Every named architecture of the plugin: built from the one preset table, shaped as its name says, and
trainable (forward and backward reach every parameter, as distributed training requires).

Presets as data (issue 54 item 5): every row parses to its preset's shape; each family is built at tiny width,
has its named number of layers and trains at its shallowest symmetric depth (E6D6) and its shallowest
deeper-encoder one (E12D6, or E36D6 for a family with only the kept depths). Every other row is checked as data:
at tiny width a family's two widths are one model (the other row parses to the same arguments), and a row of
another depth parses to exactly the arguments of its family's built row of the same kind (symmetric or deeper
encoder) but its layer counts, so it builds the same modules, only more of them (the layer count is the
arguments' own; every depth between is built alike). tests/test_golden_models.py builds every legacy row of every
depth besides (its initial weights), and checks its layer counts there."""

import copy
from argparse import Namespace

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.transformer import (
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)

from fairseq_plugins.models import DEPTHS, PRESETS, WIDTHS
from fairseq_plugins.models.presets import ALSO_KEPT, KEPT_DEPTHS, LEGACY_DEPTHS

from .helpers import REPO, TinyTask, build_model, parse_model_args, random_batch


def test_every_family_has_its_depths_at_every_width():
    """The seed families and baselines every depth (their names are legacy), every family since the kept ones
    (presets.py; tests/test_arch_names.py checks the names against their users)."""
    families = {p.family for p in PRESETS.values()}
    assert {"residual", "transformer_preln", "transformer_postln"} <= families
    legacy_names = set((REPO / "tests/golden/legacy_archs.txt").read_text().splitlines())
    for family in families:
        if not any(arch == f"{family}_e6d6" for arch in PRESETS):
            continue  # a family of single presets (e.g. a paper's one configuration)
        legacy = f"{family}_e6d6" in legacy_names
        for width in WIDTHS:
            for depth in DEPTHS:
                kept = depth in (LEGACY_DEPTHS if legacy else KEPT_DEPTHS) or f"{family}_{width}{depth}" in ALSO_KEPT
                assert (f"{family}_{width}{depth}" in ARCH_MODEL_REGISTRY) == kept, (family, width, depth)


def _twin_key(arch: str) -> tuple:
    """What a row is apart from its width: its family, model, depth and settings."""
    p = PRESETS[arch]
    return p.family, p.model, p.encoder_layers, p.decoder_layers, repr(sorted(p.settings.items()))


# at tiny width (TINY overrides every width setting) a family's two widths of one depth are one model: the row of
# the first width (the base one) is built, its twin of the other width shows that it parses to the same arguments
BUILT: dict[tuple, str] = {}
for _arch in sorted(PRESETS, key=lambda a: list(WIDTHS.values()).index(PRESETS[a].width)):
    BUILT.setdefault(_twin_key(_arch), _arch)
def _deeper_encoder(preset) -> bool:
    return preset.encoder_layers > preset.decoder_layers


# the rows that are built and train (forward and backward): per family its shallowest symmetric depth and its
# shallowest deeper-encoder depth (where an encoder layer has no decoder layer of the same index: E12D6 for the seed
# families, E36D6 for those with only the kept depths); a family of one preset trains that one
TRAINED = set()
for _family in {p.family for p in PRESETS.values()}:
    _built = sorted((PRESETS[a].encoder_layers, PRESETS[a].decoder_layers, a) for a in BUILT.values()
                    if PRESETS[a].family == _family)  # fmt: skip
    for _deeper in (False, True):
        TRAINED.update([a for e, d, a in _built if (e > d) == _deeper][:1])
# arch -> its parsed arguments at tiny width (a twin reads its built row's) and at its own (a row of another depth
# reads its trained row's)
_PARSED: dict[tuple[str, bool], dict] = {}


def _parsed(arch: str, tiny: bool) -> Namespace:
    if (arch, tiny) not in _PARSED:
        _PARSED[arch, tiny] = copy.deepcopy(vars(parse_model_args(arch, tiny=tiny)))
    return Namespace(**copy.deepcopy(_PARSED[arch, tiny]))


def _tiny_args(arch: str) -> Namespace:
    return _parsed(arch, tiny=True)


@pytest.mark.parametrize("arch", sorted(PRESETS))
def test_preset_sets_shape_and_builds_at_tiny_width(arch):
    preset = PRESETS[arch]
    args = _parsed(arch, tiny=False)
    assert (args.encoder_layers, args.decoder_layers) == (preset.encoder_layers, preset.decoder_layers)
    assert args.encoder_embed_dim == args.decoder_embed_dim == preset.width.embed_dim
    assert args.encoder_ffn_embed_dim == args.decoder_ffn_embed_dim == preset.width.ffn_dim
    assert args.encoder_attention_heads == args.decoder_attention_heads == preset.width.heads

    built = BUILT[_twin_key(arch)]
    if built != arch:  # the same model class with the same arguments builds the same model: its twin's test builds it
        assert ARCH_MODEL_REGISTRY[arch] is ARCH_MODEL_REGISTRY[built]
        assert vars(_tiny_args(arch)) == {**vars(_tiny_args(built)), "arch": arch}
        return
    if arch not in TRAINED:  # the family's trained row of the same kind, with this row's depth
        (trained,) = (a for a in TRAINED if PRESETS[a].family == preset.family
                      and _deeper_encoder(PRESETS[a]) == _deeper_encoder(preset))  # fmt: skip
        assert ARCH_MODEL_REGISTRY[arch] is ARCH_MODEL_REGISTRY[trained]
        depth = {"encoder_layers": preset.encoder_layers, "decoder_layers": preset.decoder_layers}
        assert vars(args) == {**vars(_parsed(trained, tiny=False)), "arch": arch, **depth}  # the same width
        return
    torch.manual_seed(0)  # as helpers.build_model, from the arguments parsed once
    model = ARCH_MODEL_REGISTRY[arch].build_model(_tiny_args(arch), TinyTask()).train()
    assert len(model.encoder.layers) == preset.encoder_layers
    assert len(model.decoder.layers) == preset.decoder_layers
    src, lengths, prev = random_batch(model)
    logits, _ = model(src, lengths, prev)
    logits.float().logsumexp(-1).mean().backward()
    assert torch.isfinite(logits).all()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused, f"parameters without gradient (breaks DDP): {unused[:5]}"


def test_every_family_trains_at_a_symmetric_and_a_deeper_encoder_depth():
    """The training rows above: two per family of presets at every depth, one per family of one preset."""
    families = {p.family for p in PRESETS.values()}
    for family in families:
        rows = [a for a in TRAINED if PRESETS[a].family == family]
        if sum(p.family == family for p in PRESETS.values()) == 1:
            assert len(rows) == 1, family
        else:
            shallow, deeper = sorted((PRESETS[a].encoder_layers, PRESETS[a].decoder_layers) for a in rows)
            assert shallow == (6, 6) and deeper[0] > deeper[1] == 6, family


def test_command_line_overrides_the_preset():
    args = parse_model_args("residual_e18d18", ["--encoder-layers", "2", "--decoder-embed-dim", "8"])
    assert args.encoder_layers == 2 and args.decoder_layers == 18 and args.decoder_embed_dim == 8


@pytest.mark.parametrize("arch", ["transformer_preln_e12d6", "transformer_postln_iwslt_e6d6"])
def test_baselines_are_fairseqs_own_transformer(arch):
    model = build_model(arch)
    # fairseq's class with only the --autocast-dtype option in front: no method of its model, encoder or decoder
    # is the plugin's, and without the option the encoder and decoder are fairseq's own classes
    assert isinstance(model, TransformerModel) and type(model).__mro__[2] is TransformerModel
    # register_model sets __dataclass; an empty __annotations__ appears once anything (torch.jit.script, in an earlier
    # test of the same worker) has read the class's annotations: Python 3.10+ creates it on first access
    names = {name for name, value in vars(type(model)).items() if not (name == "__annotations__" and not value)}
    assert names <= {"__module__", "__qualname__", "__doc__", "__dataclass"}
    assert set(vars(type(model).__mro__[1])) - {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__"} == {
        "add_args", "build_model"}
    assert type(model.encoder) is TransformerEncoderBase and type(model.decoder) is TransformerDecoderBase
    pre = "preln" in arch
    assert (model.encoder.layer_norm is not None) == pre and (model.decoder.layer_norm is not None) == pre
    assert all(layer.normalize_before == pre for layer in [*model.encoder.layers, *model.decoder.layers])


def _param_table(argv: list[str], capsys) -> str:
    from .helpers import load_script

    load_script("scripts/analysis/param_table.py", "param_table").main(argv)
    return capsys.readouterr().out


def test_param_table_counts_what_fairseq_builds(tmp_path, capsys, monkeypatch):
    """scripts/analysis/param_table.py (docs/architectures.md's table) reports the parameters of the models fairseq-train
    builds. The wide layout's run is of the same rows: it reads the first run's counts (each model is built once)."""
    from .helpers import load_script

    param_table, counted = load_script("scripts/analysis/param_table.py", "param_table"), {}

    def count_once(arch, extra, vocab_size, _count=param_table.count_parameters):
        key = (arch, tuple(extra), vocab_size)
        if key not in counted:
            counted[key] = _count(arch, extra, vocab_size)
        return counted[key]

    monkeypatch.setattr(param_table, "count_parameters", count_once)
    rows_file = tmp_path / "rows.json"
    out = _param_table(["--family", "dca_k2", "--family", "residual", "--width", "iwslt", "--vocab-size", "100",
                        "--json", str(rows_file)], capsys)  # fmt: skip
    import json

    rows = {r["arch"]: r for r in json.loads(rows_file.read_text())}
    assert set(rows) == {a for a, p in PRESETS.items() if p.family in ("dca_k2", "residual") and "iwslt_" in a}
    for arch in ("dca_k2_iwslt_e6d6", "residual_iwslt_e12d6"):
        from .helpers import TinyTask

        model = build_model(arch, ["--share-all-embeddings"], task=TinyTask(100 - 4), tiny=False)
        assert rows[arch]["parameters"] == sum(p.numel() for p in model.parameters())
        assert f"`{arch}`" in out
    assert rows["residual_iwslt_e6d6"]["vs_baseline"] == 0
    assert rows["dca_k2_iwslt_e6d6"]["vs_baseline"] > 0
    built = len(counted)
    wide = _param_table(["--family", "dca_k2", "--family", "residual", "--width", "iwslt", "--vocab-size", "100",
                         "--layout", "wide"], capsys)  # fmt: skip
    assert len(counted) == built  # no model counted twice
    assert "| d_model/d_ffn/heads | E/D | dca_k2 | residual |" in wide
    assert wide.count("| 256/1024/4 |") == len(DEPTHS)
