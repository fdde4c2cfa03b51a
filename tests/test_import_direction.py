"""Imports run one way, models -> axes -> modules -> kernels (docs/layout.md), and none hides a cycle inside a
function: read from the source with ast, so a new back-edge fails here before it becomes a circular import."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fairseq_plugins"
LAYERS = ("models", "axes", "modules", "kernels")  # each may import only the layers after it


def plugin_imports(path: Path, source: str | None = None):
    """(node, imported plugin module as a dotted path below fairseq_plugins, or None) for every import in ``path``."""
    package = path.relative_to(PACKAGE).parts[:-1]  # the package a relative import of level 1 names
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").startswith("fairseq_plugins"):
                target = node.module.removeprefix("fairseq_plugins").lstrip(".")
            else:
                target = None
            yield node, target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                yield node, name.removeprefix("fairseq_plugins").lstrip(".") if name.startswith("fairseq_plugins") else None


SOURCES = sorted(PACKAGE.rglob("*.py"))


def function_level(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    yield inner


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_plugin_import_inside_a_function(path, source=None):
    source = path.read_text() if source is None else source
    inside = {(node.lineno, node.col_offset) for node in function_level(ast.parse(source))}
    found = [
        node.lineno
        for node, target in plugin_imports(path, source)
        if target is not None and (node.lineno, node.col_offset) in inside
    ]
    assert not found, f"{path.name}: plugin imports inside a function at lines {found} (a cycle to remove)"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_layers_import_only_the_layers_below(path, source=None):
    layer = path.relative_to(PACKAGE).parts[0]
    if layer not in LAYERS:
        return
    above = LAYERS[: LAYERS.index(layer)]
    wrong = [
        (node.lineno, target)
        for node, target in plugin_imports(path, source)
        if target is not None and target.split(".")[0] in above
    ]
    assert not wrong, f"{path.relative_to(PACKAGE)} imports a layer above its own ({layer}): {wrong}"


def package_imports(name: str) -> set[str]:
    """The axis modules the axes package imports, directly or through each other (``axes.x`` names)."""
    seen, todo = set(), ["axes"]
    while todo:
        module = todo.pop()
        path = PACKAGE / "axes" / "__init__.py" if module == "axes" else PACKAGE / (module.replace(".", "/") + ".py")
        for _, target in plugin_imports(path):
            if target and target.startswith(f"{name}.") and target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


@pytest.mark.parametrize("module", sorted(package_imports("axes")))
def test_axis_modules_do_not_import_their_package(module):
    """The package assembles the axis modules' tables (axes/__init__.py); an axis module it imports reading the
    package back would be a cycle that only import order keeps working. (A module the package does not import,
    as grid.py, may read it.)"""
    path = PACKAGE / (module.replace(".", "/") + ".py")
    wrong = [node.lineno for node, target in plugin_imports(path) if target == "axes"]
    assert not wrong, f"{module} imports the axes package at lines {wrong}: import from axes/choice.py"


def test_the_rules_see_a_back_edge():
    """The rules resolve relative imports and see through functions: a kernels module importing modules (and the
    axes package inside a function) fails both."""
    fake = PACKAGE / "kernels" / "probe.py"  # never written: its source is given
    source = "from ..modules.mhc import gates_pytorch\n\n\ndef f():\n    from .. import axes\n"
    assert [target for _, target in plugin_imports(fake, source)] == ["modules.mhc", ""]
    with pytest.raises(AssertionError, match="inside a function"):
        test_no_plugin_import_inside_a_function(fake, source)
    with pytest.raises(AssertionError, match="layer above"):
        test_layers_import_only_the_layers_below(fake, source)
