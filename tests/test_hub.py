"""Every family of the preset table through fairseq-interactive and fairseq's hub interface.

One tiny model per family (the family's shallowest preset at width 16, two updates on the reversal corpus)
is translated twice: by the ``fairseq-interactive`` command line with ``--user-dir``, and by the family's
own model class through ``from_pretrained(...).translate()``, as a user of the Python API would. Both run
beam search with beam 5 on the same sentences, so they must give the same translations. The families come
from ``PRESETS``: a family registered later joins these tests by itself.
"""

import json
import sys

import pytest
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_plugins.models import PRESETS

from .helpers import PLUGIN_DIR, family_train_args, run, train_command

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


# one Python process runs a fairseq console script's own entry point once per argument list: the tools'
# start-up (importing fairseq and torch) is paid once, not once per family
MANY = (
    "import json, sys\n"
    "from fairseq_cli.{tool} import cli_main\n"
    "for argv in json.loads(sys.argv[1]):\n"
    "    sys.argv = ['fairseq-{tool}', *argv]\n"
    "    print('=== NEXT', flush=True)\n"
    "    cli_main()\n"
)


def run_many(tool: str, argvs: list[list]) -> list[str]:
    """Run ``fairseq-TOOL argv`` for every argv in one process; the output of each."""
    argvs = [[str(a) for a in argv] for argv in argvs]
    proc = run([sys.executable, "-c", MANY.format(tool=tool), json.dumps(argvs)], timeout=600)
    return proc.stdout.split("=== NEXT\n")[1:]


@pytest.fixture(scope="module")
def checkpoints(corpus_bin, tmp_path_factory):
    """family -> save dir of its representative, trained for 2 updates."""
    root = tmp_path_factory.mktemp("hub")
    saves = {family: root / family for family in FAMILIES}
    argvs = [train_command(corpus_bin, saves[f], arch, max_update=2, extra=family_train_args(arch))[3:]
             for f, arch in FAMILIES.items()]  # fmt: skip
    run_many("train", argvs)
    return saves


@pytest.fixture(scope="module")
def interactive(checkpoints, corpus_bin, tmp_path_factory):
    """family -> {sentence id: fairseq-interactive's translation}, beam 5."""
    source = tmp_path_factory.mktemp("input") / "input.src"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    argvs = [[corpus_bin, "--user-dir", PLUGIN_DIR, "--path", checkpoints[f] / "checkpoint_last.pt", "--cpu",
              "--beam", "5", "--source-lang", "src", "--target-lang", "tgt", "--input", source]
             for f in FAMILIES]  # fmt: skip
    out = {}
    for family, output in zip(FAMILIES, run_many("interactive", argvs), strict=True):
        hyps = {}
        for line in output.splitlines():
            if line.startswith("H-"):
                key, _score, *text = line.split("\t")
                hyps[int(key[2:])] = text[0] if text else ""
        out[family] = hyps
    return out


def test_every_family_has_a_representative():
    assert {"residual", "transformer_preln", "transformer_postln", "dca", "crossformer_hg"} <= set(FAMILIES)
    assert FAMILIES["residual"].endswith("_e6d6")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_interactive_and_hub_translate_alike(family, checkpoints, interactive, corpus_bin):
    arch, save_dir, expected = FAMILIES[family], checkpoints[family], interactive[family]
    assert sorted(expected) == list(range(len(SENTENCES))), f"fairseq-interactive left sentences out: {expected}"
    model_class = ARCH_MODEL_REGISTRY[arch]
    hub = model_class.from_pretrained(str(save_dir), checkpoint_file="checkpoint_last.pt",
                                      data_name_or_path=str(corpus_bin), source_lang="src", target_lang="tgt")  # fmt: skip
    assert type(hub.models[0]) is model_class
    assert hub.translate(SENTENCES, beam=5) == [expected[i] for i in range(len(SENTENCES))]
