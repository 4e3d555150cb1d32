"""The package's layering (README "Layout"): a module imports only from its own folder and the
layers below it, and no import, at module level or inside a function, closes a circle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from paths import REPO

PACKAGE = REPO / "src" / "ember"

# Bottom to top. Modules of one rank import each other only within the same folder.
LAYERS = [
    {"ember._core", "ember.errors", "ember.version"},
    {"ember.gguf", "ember.sysinfo"},
    {"ember.hub", "ember.quant", "ember.tokenizer"},
    {"ember.models"},
    {"ember.convert", "ember.engine"},
    {"ember.api"},
    {"ember.server"},
    {"ember.cli"},
    {"ember", "ember.__main__"},
]


def module_name(path: Path) -> str:
    parts = ("ember",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def known_modules() -> set[str]:
    return set(modules()) | {"ember._core"}  # the compiled core has no .py file


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The ember modules a module imports anywhere in its code (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from ember import _core` imports the module ember._core; `from x import name` imports x.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found.update(t for t in targets if t == "ember" or t.startswith("ember."))
    return found - {name}


def unit(name: str) -> str:
    """The layer unit a module belongs to: its top folder under ember (or the module itself)."""
    for rank in LAYERS:
        for member in sorted(rank, key=len, reverse=True):
            if name == member or name.startswith(member + "."):
                return member
    raise AssertionError(f"{name} is in no layer: add it to LAYERS")


def rank(name: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit(name) in layer)


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = known_modules()
    return {name: {t if t in known else t.rpartition(".")[0] if t.rpartition(".")[0] in known else t
                   for t in imported(name, path, known)}
            for name, path in found.items()}


def test_every_module_is_in_a_layer():
    for name in modules():
        unit(name)


def test_no_module_imports_a_layer_above_it_or_a_sibling_folder():
    upward = []
    for name, targets in import_graph().items():
        for target in targets:
            same_unit = unit(target) == unit(name)
            if not same_unit and rank(target) >= rank(name):
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_no_import_circles():
    graph = import_graph()
    circles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph.get(name, ())):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert circles == []


@pytest.mark.parametrize("source, expected", [
    ("from ember.engine.runtime import Model", {"ember.engine.runtime"}),
    ("from ember import _core", {"ember._core"}),
    ("def f():\n    from ember.cli.main import main", {"ember.cli.main"}),
])
def test_imports_are_found_at_any_depth(tmp_path, source, expected):
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert imported("ember.probe", path, known_modules()) == expected


def test_readme_layout_names_every_folder():
    layout = (REPO / "README.md").read_text(encoding="utf-8").split("### Layout", 1)[1].split("\n## ", 1)[0]
    folders = [p for root in ("src/ember", "csrc") for p in (REPO / root).rglob("*")
               if p.is_dir() and "__pycache__" not in p.parts]
    missing = [str(p.relative_to(REPO)) for p in folders
               if f"`{p.relative_to(REPO)}/`" not in layout and f"`{p.name}/`" not in layout]
    assert missing == []
