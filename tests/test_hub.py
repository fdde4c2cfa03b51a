"""Every family of the preset table through fairseq-interactive and fairseq's hub interface.

One tiny model per family (the family's shallowest preset at width 16, two updates on the reversal corpus)
is translated twice: by the ``fairseq-interactive`` command line with ``--user-dir``, and by the family's
own model class through ``from_pretrained(...).translate()``, as a user of the Python API would. Both run
beam search with beam 5 and the same length limit on the same sentences, so they must give the same
translations. The families come from ``PRESETS``: a family registered later joins these tests by itself.
"""

import pytest
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_plugins.models import PRESETS

from .helpers import PLUGIN_DIR, family_train_args, train_command

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


FAMILIES = representatives()


# a model trained for 2 updates never ends a sentence: decoding stops at the length limit, fairseq's default 200
# tokens; both sides get the same fixed limit instead, room for the longest sentence's whole translation and its
# end (not one relative to the source length: the hub decodes the sentences in one padded batch, fairseq-interactive
# one at a time), so the comparison is unchanged and each family decodes 10 steps instead of 200
MAX_LEN = {"max_len_a": 0, "max_len_b": 10}


@pytest.fixture(scope="module")
def interactive(corpus_bin, tmp_path_factory, in_one_forked_process):
    """family -> (save dir of its representative trained for 2 updates, {sentence id: fairseq-interactive's
    translation, beam 5}); every training, then every fairseq-interactive, in one process (tests/one_process.py,
    forked from the fork server: conftest.py in_one_forked_process)."""
    root = tmp_path_factory.mktemp("hub")
    saves = {family: root / family for family in FAMILIES}
    source = root / "input.src"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    trains = [("train", train_command(corpus_bin, saves[f], arch, max_update=2, extra=family_train_args(arch))[3:])
              for f, arch in FAMILIES.items()]  # fmt: skip
    limits = [a for k, v in MAX_LEN.items() for a in (f"--{k.replace('_', '-')}", v)]
    decodes = [("interactive", [corpus_bin, "--user-dir", PLUGIN_DIR, "--path", saves[f] / "checkpoint_last.pt",
                                "--cpu", "--beam", "5", *limits, "--source-lang", "src", "--target-lang", "tgt",
                                "--input", source]) for f in FAMILIES]  # fmt: skip
    runs = in_one_forked_process(trains + decodes)
    out = {}
    for family, trained, decoded in zip(FAMILIES, runs[: len(FAMILIES)], runs[len(FAMILIES) :], strict=True):
        hyps = {}
        for line in decoded.output.splitlines():
            if line.startswith("H-"):
                key, _score, *text = line.split("\t")
                hyps[int(key[2:])] = text[0] if text else ""
        out[family] = (saves[family], trained, decoded, hyps)
    return out


def test_every_family_has_a_representative():
    assert {"residual", "transformer_preln", "transformer_postln", "dca", "crossformer_hg"} <= set(FAMILIES)
    assert FAMILIES["residual"].endswith("_e6d6")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_interactive_and_hub_translate_alike(family, interactive, corpus_bin):
    arch, (save_dir, trained, decoded, expected) = FAMILIES[family], interactive[family]
    trained.check()
    decoded.check()
    assert sorted(expected) == list(range(len(SENTENCES))), f"fairseq-interactive left sentences out: {expected}"
    model_class = ARCH_MODEL_REGISTRY[arch]
    hub = model_class.from_pretrained(str(save_dir), checkpoint_file="checkpoint_last.pt",
                                      data_name_or_path=str(corpus_bin), source_lang="src", target_lang="tgt")  # fmt: skip
    assert type(hub.models[0]) is model_class
    assert hub.translate(SENTENCES, beam=5, **MAX_LEN) == [expected[i] for i in range(len(SENTENCES))]
