"""The README is a short front page and every page it links exists: the reference text lives in docs/, one
page per topic, and the links between them resolve, the studies' pages and plots included; committed pages name no
path of the machine they were written on."""

import re

import pytest

from .helpers import REPO

README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
# the studies' READMEs and reports (their plots among the links), not the run records
STUDY_PAGES = sorted(p for p in (REPO / "docs" / "study").rglob("*.md") if "runs" not in p.parts)
# a Markdown link to a file of the repository: [text](target), not a web address or an anchor
LINK = re.compile(r"\]\((?!https?://|#|mailto:)([^)\s]+)\)")
MACHINE_PATH = re.compile(r"(?<![\w.])(/work/|/root/|/home/\w+)")


def test_readme_is_a_front_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for section in ("## Two commands", "## Axes and families", "## Using the plugin with fairseq",
                    "## Findings in brief", "## Documentation"):  # fmt: skip
        assert f"\n{section}\n" in text, section
    # the two commands a newcomer types (.ci/run runs the second), and the offline form of the first
    assert "bash recipes/main_job.sh      # the main job" in text
    assert "bash scripts/run_tests.sh     # the tests (offline)" in text
    assert "MULTI30K_DIR=../shared/data/multi30k bash recipes/main_job.sh" in text


def test_readme_links_every_topic_page():
    linked = set(LINK.findall(README.read_text(encoding="utf-8")))
    topics = [p for p in PAGES if p.read_text(encoding="utf-8").startswith("# ")]  # tools' tables have no title
    missing = sorted(p.name for p in topics if f"docs/{p.name}" not in linked)
    assert not missing, f"docs pages the README does not link: {missing}"


@pytest.mark.parametrize("page", [README, *PAGES, *STUDY_PAGES],
                         ids=lambda p: p.relative_to(REPO).as_posix())  # fmt: skip
def test_links_resolve(page):
    broken = [t for t in LINK.findall(page.read_text(encoding="utf-8"))
              if not (page.parent / t.split("#")[0]).exists()]  # fmt: skip
    assert not broken, f"{page.name}: links to missing files {broken}"


@pytest.mark.parametrize("page", [README, *PAGES, *STUDY_PAGES],
                         ids=lambda p: p.relative_to(REPO).as_posix())  # fmt: skip
def test_no_machine_paths(page):
    found = [m.group(0) for m in MACHINE_PATH.finditer(page.read_text(encoding="utf-8"))]
    assert not found, f"{page.name} names paths of this machine: {found}"
