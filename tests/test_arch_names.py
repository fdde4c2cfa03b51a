"""Names users rely on keep working, and the preset tables register no other (issue 54 item 7): every ``--arch``
name registered before the axes and the 2024-26 ideas (tests/golden/legacy_archs.txt, 350 names) and every arch
name a committed file uses (commands, recipes, study records, tests, golden checkpoints, docs) is registered and
builds; every registered preset is one of those or in the tables' kept set (models/presets.py, lm/presets.py)."""

import re
import subprocess

import pytest
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_plugins.lm import LM_FAMILIES, LM_PRESETS
from fairseq_plugins.lm import presets as lm_presets
from fairseq_plugins.models import PRESETS
from fairseq_plugins.models import presets as translation_presets

from .helpers import REPO, build_model
from .lm_helpers import binarize_lm, build_lm, make_lm_corpus

LEGACY = [line for line in (REPO / "tests/golden/legacy_archs.txt").read_text().splitlines() if not line.startswith("#")]
# what a preset name looks like: {family}_{width}e{E}d{D} (translation), {family}_lm_{width}d{L} (language model)
TRANSLATION_NAME = re.compile(r"^(?P<family>[a-z][a-z0-9_]*?)_(?:iwslt_)?(?P<depth>e\d+d\d+)$")
LM_NAME = re.compile(r"^(?P<family>[a-z][a-z0-9_]*?)_lm_(?:(?P<width>gpt|big)_)?d(?P<layers>\d+)$")
BINARY = (".pt", ".png", ".jpg", ".pdf", ".gz", ".bin", ".idx", ".so", ".o")


def repository_files() -> list[str]:
    """The repository's files as git sees them: committed ones and new ones not ignored (a checkout without git:
    every file under the repository but hidden folders and the virtual environment)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, check=True).stdout.decode()  # fmt: skip
        return sorted(set(filter(None, out.split("\0"))))
    except (OSError, subprocess.CalledProcessError):
        return sorted(str(p.relative_to(REPO)) for p in REPO.rglob("*")
                      if p.is_file() and not any(part.startswith(".") for part in p.relative_to(REPO).parts))  # fmt: skip


def preset_shaped(word: str) -> re.Match | None:
    """The match of a word that has a preset name's shape with one of the tables' depths (``residual_e7d7``, a
    test's unknown name, has none)."""
    m = TRANSLATION_NAME.match(word)
    if m and m["depth"] in translation_presets.DEPTHS:
        return m
    m = LM_NAME.match(word)
    return m if m and int(m["layers"]) in lm_presets.LM_DEPTHS else None


# the bytes of a word ([A-Za-z0-9_]) kept, every other byte a space: an ASCII file's words are its translated bytes
# split at spaces, a few times faster than the regular expression on the 46 MB of logs, corpora and records
WORD_BYTES = bytes(c if chr(c).isalnum() or c == ord("_") else ord(" ") for c in range(128)) + b" " * 128


def file_words(path: str) -> set[str]:
    """Every word of a file's path, and of its text where it is UTF-8 and no binary file."""
    words = set(re.findall(r"[A-Za-z0-9_]+", path))
    if path.endswith(BINARY) or not (REPO / path).is_file():
        return words
    data = (REPO / path).read_bytes()
    if data.isascii():
        words.update(data.translate(WORD_BYTES).decode("ascii").split())
    else:
        try:
            words.update(re.findall(r"[A-Za-z0-9_]+", data.decode("utf-8")))
        except UnicodeDecodeError:
            pass
    return words


def used_names() -> dict[str, str]:
    """arch name -> the first file that uses it: every word of a file's path or text that is a registered arch or
    model name, or that has a preset name's shape with a family of the tables (so a name the tables stopped
    registering is found too). Study folders such as ``depth_e12d12`` have the shape but no family. The LM families
    are the translation ones (lm/presets.py reads them from PRESETS). Each word is looked at once, in the first file
    (in path order) that has it."""
    families = {p.family for p in PRESETS.values()}
    found: dict[str, str] = {}
    seen: set[str] = set()
    for path in repository_files():
        new = file_words(path) - seen
        seen |= new
        for word in new:
            shaped = preset_shaped(word)
            if word in ARCH_MODEL_REGISTRY or (shaped and shaped["family"] in families):
                found[word] = path
    return found


USED = used_names()
PLUGIN = {arch for arch in USED if arch in ARCH_MODEL_REGISTRY and ARCH_MODEL_REGISTRY[arch].__module__.startswith(
    "fairseq_plugins")} | {arch for arch in USED if arch not in ARCH_MODEL_REGISTRY}  # fmt: skip


def test_the_legacy_names_are_the_350_before_the_axes():
    assert len(LEGACY) == len(set(LEGACY)) == 350
    assert sum(arch in PRESETS for arch in LEGACY) == 337  # 21 families x 2 widths x 8 depths + crossformer_all_e16d6


def test_every_legacy_and_used_name_is_registered():
    missing = sorted({*LEGACY, *PLUGIN} - set(ARCH_MODEL_REGISTRY))
    assert not missing, [f"{arch} (used by {USED.get(arch, 'tests/golden/legacy_archs.txt')})" for arch in missing]


# every legacy and used translation name that is no preset row (test_presets.py builds each row): the family
# model names and residual_axes
NOT_ROWS = sorted(arch for arch in {*LEGACY, *PLUGIN} if arch not in PRESETS and arch not in LM_PRESETS)


@pytest.mark.parametrize("arch", NOT_ROWS)
def test_every_legacy_and_used_model_name_builds(arch):
    model = build_model(arch)
    assert len(model.encoder.layers) == len(model.decoder.layers) == 6  # fairseq's default depth


@pytest.fixture(scope="module")
def lm_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_corpus")
    return binarize_lm(make_lm_corpus(root / "raw", sizes=(("train", 20), ("valid", 4), ("test", 4))), root / "bin")


# at tiny size (lm_helpers.TINY_LM sets the depth and width) a family's LM names of one width are one model: the
# first used name of each family and width is built
LM_BUILT: dict[tuple, str] = {}
for _arch in sorted(arch for arch in PLUGIN if arch in LM_PRESETS):
    LM_BUILT.setdefault((LM_PRESETS[_arch].family, LM_NAME.match(_arch)["width"]), _arch)


@pytest.mark.parametrize("arch", sorted(LM_BUILT.values()))
def test_every_used_language_model_name_builds(lm_bin, arch):
    model, _, args = build_lm(lm_bin, arch)
    assert args.decoder_embed_dim == 16 and len(model.decoder.layers) == 3  # tiny, as lm_helpers.TINY_LM


def test_the_translation_table_registers_only_legacy_kept_or_used_names():
    legacy = set(LEGACY)
    extra = sorted(arch for arch in PRESETS if arch not in legacy and arch not in USED
                   and TRANSLATION_NAME.match(arch)["depth"] not in translation_presets.KEPT_DEPTHS)  # fmt: skip
    assert not extra, f"registered but neither legacy, at a kept depth nor used by a file: {extra}"
    unused = sorted(translation_presets.ALSO_KEPT - set(USED))
    assert not unused, f"presets.ALSO_KEPT names no committed file uses: {unused}"
    # every family since the seed ones: each kept depth at both widths, and nothing else but ALSO_KEPT
    for family in {p.family for p in PRESETS.values()} - {p.family for a, p in PRESETS.items() if a in legacy}:
        names = {a for a, p in PRESETS.items() if p.family == family}
        kept = {f"{family}_{w}{d}" for w in translation_presets.WIDTHS for d in translation_presets.KEPT_DEPTHS}
        assert names - translation_presets.ALSO_KEPT == kept, family


def test_the_language_model_table_registers_only_kept_or_used_names():
    extra = []
    for arch, preset in LM_PRESETS.items():
        width = LM_NAME.match(arch)["width"] or ""
        swept = preset.family in lm_presets.LM_SWEPT_FAMILIES and width == ""
        if arch not in USED and preset.layers not in lm_presets.LM_KEPT_DEPTHS and not swept:
            extra.append(arch)
    assert not extra, f"registered but neither at a kept depth, in DCA figure 6's sweep nor used by a file: {extra}"
    unused = sorted(lm_presets.LM_ALSO_KEPT - set(USED))
    assert not unused, f"lm/presets.LM_ALSO_KEPT names no committed file uses: {unused}"
    for family in LM_FAMILIES:
        for width in lm_presets.LM_WIDTHS:
            for layers in lm_presets.LM_KEPT_DEPTHS:
                assert f"{family}_lm_{width}d{layers}" in LM_PRESETS
