"""docs/layout.md's and docs/testing.md's file lists: every module, script and test with its own first sentence."""

from pathlib import Path

from .markdown import REPO, docstring, first_sentence, table

LAYOUT_ROOTS = ("fairseq_residual.py", "fairseq_plugins", "scripts", "recipes")


def layout_files() -> str:
    """Every module, script and recipe under LAYOUT_ROOTS with its own first sentence, folder by folder."""
    lines = []
    for root in LAYOUT_ROOTS:
        path = REPO / root
        files = [path] if path.is_file() else [
            p for p in path.rglob("*") if p.suffix in (".py", ".sh", ".c") and "__pycache__" not in p.parts]
        folders: dict[str, list[Path]] = {}
        for file in files:
            folders.setdefault(file.relative_to(REPO).parent.as_posix(), []).append(file)
        for folder, in_folder in sorted(folders.items()):
            if folder != ".":
                lines += ["", f"**`{folder}/`**", ""]
            for file in sorted(in_folder):
                shown_as = file.name if folder != "." else file.relative_to(REPO).as_posix()
                lines.append(f"- `{shown_as}`: {first_sentence(docstring(file))}")
    return "\n".join(lines).strip() + "\n"


def test_files() -> list[Path]:
    return sorted((REPO / "tests").glob("test_*.py"))


def testing_files() -> str:
    rows = [[f"`tests/{p.name}`", first_sentence(docstring(p)) or "(no docstring)"] for p in test_files()]
    return "\n".join([f"{len(rows)} test files, each with its docstring's first sentence:", "",
                      *table(["file", "what it checks"], rows)]) + "\n"  # fmt: skip
