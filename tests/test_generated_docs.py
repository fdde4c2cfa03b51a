"""Every generated file is what `python -m scripts.regenerate` writes from the declarations today (docs/options.md,
docs/grid.md, the README's axes table, docs/architectures.md's names, docs/layout.md's and docs/testing.md's file
lists, the golden command tables); docs/options.md names every option of the plugin and docs/testing.md every test
file; --check names a stale file and writes nothing; a write replaces the file whole."""

import difflib
import re

import pytest

from scripts import regenerate

from .helpers import REPO

FIX = f"run `{regenerate.COMMAND}` and review the diff"


@pytest.mark.parametrize("target", regenerate.TARGETS, ids=lambda t: t.path)
def test_generated_file_is_up_to_date(target):
    current = regenerate.read(REPO / target.path)
    try:
        expected = target.expected(current)
    except regenerate.StaleError as err:
        pytest.fail(f"{err}; {FIX}")
    if expected != current:
        diff = difflib.unified_diff((current or "").splitlines(), expected.splitlines(), "checked in", "generated",
                                    lineterm="", n=0)  # fmt: skip
        pytest.fail(f"{target.path} is stale: {FIX}\n" + "\n".join(list(diff)[:30]))


def test_every_generated_file_says_so_and_names_the_command():
    for target in regenerate.TARGETS:
        text = (REPO / target.path).read_text(encoding="utf-8")
        if target.part is not None:
            assert regenerate.start_marker(target.part) in text, target.path
        elif target.path.endswith(".md"):
            assert text.splitlines()[2] == regenerate.GENERATED, target.path  # after the title, a topic page still
        else:
            assert any(line.startswith("# regenerate: python ") for line in text.splitlines()[:5]), target.path


def test_options_page_names_every_option_of_the_plugin():
    """Every option a plugin model adds to fairseq's parser (found from the parsers, not the declarations) and every
    option of the plugin's criterion has a row."""
    text = (REPO / "docs" / "options.md").read_text(encoding="utf-8")
    names = [*regenerate.plugin_model_options(), *(f.name for f in regenerate.criterion_options())]
    assert len(names) >= 40  # 41 model options and the criterion's one when this test was written
    missing = [n for n in names if f"`{regenerate.flag(n)}" not in text]
    assert not missing, f"docs/options.md lacks {missing}: {FIX}"


def test_testing_page_lists_every_test_file():
    text = (REPO / "docs" / "testing.md").read_text(encoding="utf-8")
    missing = [p.name for p in sorted((REPO / "tests").glob("test_*.py")) if f"`tests/{p.name}`" not in text]
    assert not missing, f"docs/testing.md lacks {missing}: {FIX}"


def test_layout_names_only_what_exists():
    """Every file and folder the hand-written tree of docs/layout.md names exists (the list below it is generated)."""
    hand = (REPO / "docs" / "layout.md").read_text(encoding="utf-8").split("\n## Files\n")[0]
    here = {"/" + p.relative_to(REPO).as_posix() for root in ("fairseq_plugins", "scripts", "tests", "recipes", "docs")
            for p in (REPO / root).rglob("*") if "__pycache__" not in p.parts}  # fmt: skip
    here |= {"/" + p.name for p in REPO.iterdir()}
    tree = [re.split(r"\s{2,}", line.strip())[0] for line in hand.splitlines() if re.match(r" {4}\S", line)]
    named = {name.rstrip("/") for entry in tree for name in entry.split()}
    named |= set(re.findall(r"[\w.-]+\.(?:py|sh|c|txt)\b", hand))
    missing = sorted(n for n in named if not any(path.endswith("/" + n) for path in here))  # a path's tail
    assert not missing, f"docs/layout.md names what does not exist: {missing}"
    for folder in ("axes", "lm", "models", "modules", "kernels", "criterions"):
        assert f"{folder}/" in hand, folder


def test_check_names_a_stale_file_and_writes_nothing(tmp_path, monkeypatch, capsys):
    (tmp_path / "docs").mkdir()
    targets = [t for t in regenerate.TARGETS if t.path in ("docs/options.md", "docs/grid.md")]
    monkeypatch.setattr(regenerate.targets, "REPO", tmp_path)
    monkeypatch.setattr(regenerate.targets, "TARGETS", tuple(targets))
    (tmp_path / "docs" / "options.md").write_text("# Options\n\nold\n")
    assert regenerate.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "stale: docs/options.md" in err and "stale: docs/grid.md" in err and regenerate.COMMAND in err
    assert (tmp_path / "docs" / "options.md").read_text() == "# Options\n\nold\n"
    assert not (tmp_path / "docs" / "grid.md").exists()

    assert regenerate.main([]) == 0
    assert regenerate.main(["--check"]) == 0
    assert sorted(p.name for p in (tmp_path / "docs").iterdir()) == ["grid.md", "options.md"]  # no temporary left


def test_a_part_without_its_markers_is_an_error_naming_the_file(tmp_path, monkeypatch, capsys):
    [readme] = [t for t in regenerate.TARGETS if t.path == "README.md"]
    monkeypatch.setattr(regenerate.targets, "REPO", tmp_path)
    monkeypatch.setattr(regenerate.targets, "TARGETS", (readme,))
    (tmp_path / "README.md").write_text("# Front page\n")
    assert regenerate.main([]) == 1
    assert "README.md: no '<!-- generated: axes table" in capsys.readouterr().err
    assert (tmp_path / "README.md").read_text() == "# Front page\n"
    assert regenerate.main(["--check"]) == 1
