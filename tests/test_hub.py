"""Every family of the preset table through fairseq-interactive and fairseq's hub interface.

One tiny model per family (the family's shallowest preset at width 16, two updates on the reversal corpus)
is translated twice: by the ``fairseq-interactive`` command line with ``--user-dir``, and by the family's
own model class through ``from_pretrained(...).translate()``, as a user of the Python API would. Both run
beam search with beam 5 and the same length limit on the same sentences, so they must give the same
translations. The families come from ``PRESETS``: a family registered later joins these tests by itself.

CI runs every axis choice once, not every family (issue 54 item 5; every family with ALL_FAMILIES=1): the families
whose code paths no combination of ``residual_axes`` takes (``own_code_paths``: fairseq's transformer, the presets
that set an option beside the axes or train with options of their own, one family of each kind of legacy model
name), then ``residual_axes`` on the combinations of the covering sample (tests/grid_sample.py) that hold every axis
choice those families do not. Every other family is ``residual_axes``, or an alias of it whose class and
architecture function are the same code as a run family's with other axis defaults (families.py
``_register_alias``), with choices the run set holds, trained, saved, loaded and decoded by the same code: the
reduced set takes every code path the families do, and the residual choice ``post``, which no family makes,
besides. (Every legacy family's own checkpoint loads through its model name in tests/test_golden_models.py.)
"""

import os

import pytest
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_plugins.models import PRESETS
from fairseq_plugins.models.axes_transformer import MODEL
from fairseq_plugins.models.families import DERIVED, LEGACY
from fairseq_plugins.models.families import FAMILIES as LEGACY_MODELS

from .grid_sample import (
    axis_flags,
    choices_of,
    combo_id,
    covering_sample,
    family_choices,
    options_beside_the_axes,
    working,
)
from .helpers import FAMILY_TRAIN_ARGS, PLUGIN_DIR, family_train_args, train_command

SENTENCES = ["w1 w2 w3", "w4 w5 w6 w7 w8"]


def representatives() -> dict[str, str]:
    """family -> its shallowest registered preset (ties: the name first in sort order)."""
    best: dict[str, str] = {}
    for arch in sorted(PRESETS):
        preset = PRESETS[arch]
        depth = preset.encoder_layers + preset.decoder_layers
        current = best.get(preset.family)
        if current is None or depth < PRESETS[current].encoder_layers + PRESETS[current].decoder_layers:
            best[preset.family] = arch
    return best


def own_code_paths(families: dict[str, str]) -> dict[str, str]:
    """The families of ``families`` (family -> preset) whose code paths no combination of ``residual_axes`` takes:
    a model without the axes (fairseq's transformer: transformer_preln and _postln), a preset that sets a model
    option beside the axes (grid_sample.options_beside_the_axes: value_residual, hybridnorm_star, crossformer_sg's
    soft guidance) or trains with options of its own (helpers.FAMILY_TRAIN_ARGS: crossformer_sg's criterion), and
    one family of each kind of legacy model name (families.py): an alias class whose architecture function only
    sets the axis defaults (the same code, ``_register_alias``, for each of them: the first such model's family), a
    model that derives its choice from a legacy option (``DERIVED``: laurel_transformer's ``laurel_variant``,
    hc_transformer's ``hc_mode``) and one that translates a legacy option (``LEGACY``: crossformer_hg's
    ``--guidance``), each its family named after it, else the first in sort order."""
    keep = {f for f, arch in families.items() if options_beside_the_axes(arch) != {} or f in FAMILY_TRAIN_ARGS}
    plain = next(m for m in LEGACY_MODELS if m not in DERIVED and m not in LEGACY)
    for model in (plain, *DERIVED, *LEGACY):
        members = sorted(f for f, arch in families.items() if PRESETS[arch].model == model)
        if members and not keep & set(members):
            keep.add(min(members, key=lambda f: (f != model.removesuffix("_transformer"), f)))
    return {f: families[f] for f in sorted(keep)}


FAMILIES = representatives()
RUN = FAMILIES if os.environ.get("ALL_FAMILIES") == "1" else own_code_paths(FAMILIES)
# the combinations holding every axis choice the families run do not (with ALL_FAMILIES=1: those no family makes)
COMBOS = covering_sample(covered=family_choices(a for a in RUN.values() if options_beside_the_axes(a) is not None))
# name -> (arch, its training options)
MODELS = {**{f: (arch, family_train_args(arch)) for f, arch in RUN.items()},
          **{f"{MODEL}:{combo_id(c)}": (MODEL, axis_flags(c)) for c in COMBOS}}  # fmt: skip


# a model trained for 2 updates never ends a sentence: decoding stops at the length limit, fairseq's default 200
# tokens; both sides get the same fixed limit instead, room for the longest sentence's whole translation and its
# end (not one relative to the source length: the hub decodes the sentences in one padded batch, fairseq-interactive
# one at a time), so the comparison is unchanged and each family decodes 10 steps instead of 200
MAX_LEN = {"max_len_a": 0, "max_len_b": 10}


@pytest.fixture(scope="module")
def interactive(corpus_bin, tmp_path_factory, in_one_forked_process):
    """name -> (save dir of its model trained for 2 updates, its training and fairseq-interactive runs,
    {sentence id: fairseq-interactive's translation, beam 5}); every training, then every fairseq-interactive, in
    one process (tests/one_process.py, forked from the fork server: conftest.py in_one_forked_process)."""
    root = tmp_path_factory.mktemp("hub")
    saves = {name: root / name.replace(":", "_").replace("/", "_") for name in MODELS}
    source = root / "input.src"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    trains = [("train", train_command(corpus_bin, saves[name], arch, max_update=2, extra=extra)[3:])
              for name, (arch, extra) in MODELS.items()]  # fmt: skip
    limits = [a for k, v in MAX_LEN.items() for a in (f"--{k.replace('_', '-')}", v)]
    decodes = [("interactive", [corpus_bin, "--user-dir", PLUGIN_DIR, "--path", saves[name] / "checkpoint_last.pt",
                                "--cpu", "--beam", "5", *limits, "--source-lang", "src", "--target-lang", "tgt",
                                "--input", source]) for name in MODELS]  # fmt: skip
    runs = in_one_forked_process(trains + decodes)
    out = {}
    for name, trained, decoded in zip(MODELS, runs[: len(MODELS)], runs[len(MODELS) :], strict=True):
        hyps = {}
        for line in decoded.output.splitlines():
            if line.startswith("H-"):
                key, _score, *text = line.split("\t")
                hyps[int(key[2:])] = text[0] if text else ""
        out[name] = (saves[name], trained, decoded, hyps)
    return out


def test_every_family_has_a_representative():
    assert {"residual", "transformer_preln", "transformer_postln", "dca", "crossformer_hg"} <= set(FAMILIES)
    assert FAMILIES["residual"].endswith("_e6d6")


def test_the_run_set_holds_every_axis_choice_and_every_own_code_path():
    """CI's reduced set: every family's own code paths, and every axis choice of every family (and of the grid)."""
    reduced = own_code_paths(FAMILIES)
    assert set(reduced) >= {"transformer_preln", "transformer_postln", "crossformer_sg", "value_residual",
                            "hybridnorm_star", "residual", "laurel_lr", "hc_dynamic", "crossformer_hg"}  # fmt: skip
    # the legacy models left out are plain aliases: the same class body and architecture function, other defaults
    plain = {PRESETS[a].model for a in FAMILIES.values()} - {MODEL, *DERIVED, *LEGACY} - {PRESETS[a].model for a in reduced.values()}
    assert plain and all(set(vars(ARCH_MODEL_REGISTRY[m])) <= {"__doc__", "__module__", "architecture", "__dataclass", "__annotations__"}
                         and ARCH_MODEL_REGISTRY[m].__bases__ == (ARCH_MODEL_REGISTRY[MODEL],) for m in plain)  # fmt: skip
    held = family_choices(a for a in reduced.values() if options_beside_the_axes(a) is not None)
    held |= set().union(*map(choices_of, COMBOS))
    assert held >= set().union(*map(choices_of, working()))  # every choice of the grid, the families' among them


@pytest.mark.parametrize("name", list(MODELS))
def test_interactive_and_hub_translate_alike(name, interactive, corpus_bin):
    arch, (save_dir, trained, decoded, expected) = MODELS[name][0], interactive[name]
    trained.check()
    decoded.check()
    assert sorted(expected) == list(range(len(SENTENCES))), f"fairseq-interactive left sentences out: {expected}"
    model_class = ARCH_MODEL_REGISTRY[arch]
    hub = model_class.from_pretrained(str(save_dir), checkpoint_file="checkpoint_last.pt",
                                      data_name_or_path=str(corpus_bin), source_lang="src", target_lang="tgt")  # fmt: skip
    assert type(hub.models[0]) is model_class
    assert hub.translate(SENTENCES, beam=5, **MAX_LEN) == [expected[i] for i in range(len(SENTENCES))]
