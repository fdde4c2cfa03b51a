"""scripts/ is a package (issue 57): every tool runs as ``python -m scripts.GROUP.MODULE`` from the repository root,
and no file under scripts/ or tests/ edits ``sys.path`` to find another (one tool per group is started here)."""

import ast
import json
import os
import subprocess
import sys

from .helpers import REPO

# one tool of each group, and the top-level ones
TOOLS = ("scripts.study.study", "scripts.training.train_recipe", "scripts.lm.train_lm", "scripts.data.prepare_multi30k",
         "scripts.analysis.param_table", "scripts.benchmark.benchmark", "scripts.regenerate")  # fmt: skip


def _is_sys_path(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) and node.value.id == "sys"


def sys_path_edits(source: str) -> list[int]:
    """Lines that assign to sys.path (``sys.path = ...``, ``sys.path[:0] = ...``, ``+=``) or call one of its
    mutating methods (``insert``, ``append``, ``extend``, ...)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        for target in targets:
            if _is_sys_path(target) or (isinstance(target, ast.Subscript) and _is_sys_path(target.value)):
                lines.append(node.lineno)
        call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_sys_path(node.func.value)
        if call and node.func.attr in ("insert", "append", "extend", "remove", "pop", "clear", "reverse", "sort"):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_check_finds_every_form_of_edit():
    found = sys_path_edits("import sys\nsys.path.insert(0, 'x')\nsys.path[:0] = ['y']\nsys.path.append('z')\n"
                           "sys.path += ['w']\nsys.path = []\nprint(sys.path)\ns = 'sys.path.insert(0, x)'\n")  # fmt: skip
    assert found == [2, 3, 4, 5, 6]


def test_no_file_under_scripts_or_tests_edits_sys_path():
    offenders = []
    for folder in ("scripts", "tests"):
        for path in sorted((REPO / folder).rglob("*.py")):
            offenders += [f"{path.relative_to(REPO)}:{line}" for line in sys_path_edits(path.read_text(encoding="utf-8"))]
    assert not offenders, f"sys.path edited (import by package name, python -m scripts.GROUP.MODULE): {offenders}"


def test_every_folder_of_scripts_is_a_package():
    folders = [REPO / "scripts", *(p for p in (REPO / "scripts").iterdir() if p.is_dir() and any(p.glob("*.py")))]
    assert [str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").is_file()] == []


# run in ONE fresh interpreter started in the repository root without PYTHONPATH: each tool through runpy's
# run_module with run_name "__main__" and alter_sys (what ``python -m`` does, sys.path[0] the current directory),
# its --help output captured; one interpreter start and one torch import instead of one per tool
HELP_OF_EACH = """
import contextlib, io, json, runpy, sys
out = {}
for name in sys.argv[1:]:
    buffer, code = io.StringIO(), None
    sys.argv[1:] = ["--help"]
    try:
        with contextlib.redirect_stdout(buffer):
            runpy.run_module(name, run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        code = exit.code
    out[name] = [code, buffer.getvalue()]
print(json.dumps(out))
"""


def test_one_tool_of_each_group_runs_as_a_module_from_the_repository_root():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the repository root is the current directory
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", HELP_OF_EACH, *TOOLS], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(results) == list(TOOLS)
    failed = {name: out[-1500:] for name, (code, out) in results.items() if code not in (0, None) or "usage:" not in out}
    assert not failed, failed
