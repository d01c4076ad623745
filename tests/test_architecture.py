"""The shape of `core/`: rooms named for pipeline stages, and imports that never loop back.

The import graph is read from the source with `ast`, counting imports inside functions too, so a
lazy import cannot hide a circle. A lazy import is allowed only for a heavy optional dependency.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core"
ROOT_MODULES = {"__init__.py", "errors.py", "settings.py", "trace.py"}  # what every stage shares
ROOMS = {"pair", "scoring", "decoding", "annotate", "io", "views", "analysis", "evaluation", "instruments",
         "scale", "demo", "cli"}


def module_names() -> dict[str, Path]:
    """Dotted module name -> file, for every module of core (a package is its __init__)."""
    out = {}
    for path in CORE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the core modules it imports (anywhere in the file). `from pkg import sub` points at the
    submodule; a package's own `__init__` counts only when a name is taken from it."""
    graph: dict[str, set[str]] = defaultdict(set)

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in _walk_runtime(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".")[: len(mod.split(".")) - node.level + (1 if is_pkg else 0)]
                    base = ".".join(pkg + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.append(full if full in modules else base)
            for target in targets:
                found = owner(target) if target.split(".")[0] == "core" else None
                if found and found != mod:
                    graph[mod].add(found)
    return graph


def _walk_runtime(tree: ast.AST):
    """ast.walk, skipping `if TYPE_CHECKING:` blocks (names for type hints, never imported at run time)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_in_core():
    graph = import_graph(module_names())
    loops = cycles(graph)
    detail = "\n".join(
        f"{loop}: " + "; ".join(f"{a} -> {b}" for a in loop for b in sorted(graph[a]) if b in loop) for loop in loops
    )
    assert not loops, f"import cycles in core (function-level imports count):\n{detail}"


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_graph_sees_function_level_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "core"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from core.b import g\n")
    (pkg / "b.py").write_text("from core import a\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__), "CORE", pkg)
    graph = import_graph(module_names())
    assert cycles(graph) == [["core.a", "core.b"]]


def test_core_root_holds_only_the_shared_record():
    loose = sorted(p.name for p in CORE.glob("*.py") if p.name not in ROOT_MODULES)
    assert not loose, f"modules loose in core/ (move each into the room of its stage): {loose}"
    rooms = {p.name for p in CORE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert rooms <= ROOMS, f"unknown rooms {sorted(rooms - ROOMS)} (add them to docs/ARCHITECTURE.md and ROOMS)"


def test_trace_is_data():
    """The record imports no view, annotation, store or model code."""
    graph = import_graph(module_names())
    assert graph["core.trace"] <= {"core.errors", "core.scoring.registry"}, graph["core.trace"]


# Modules that load a heavy optional package when imported: the only core modules another may import lazily.
HEAVY = {
    "core.annotate.planning": "spacy",
    "core.views.notebook": "anywidget",
    "core.analysis.report": "plotly",
    "core.analysis.paper": "plotly",
    "core.analysis.gates_report": "plotly",
}
EDGES = ("core/cli/",)  # the CLI loads each command's stack only when it runs (`forkpoint ls` starts without torch)


def test_heavy_modules_really_are_heavy():
    """Each exemption names a module that imports its heavy package (directly or through Ray's loader)."""
    for mod, package in HEAVY.items():
        source = (ROOT / (mod.replace(".", "/") + ".py")).read_text(encoding="utf-8")
        assert f"import {package}" in source or f"from {package}" in source, (mod, package)


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_lazy_imports_only_defer_heavy_optional_dependencies(path):
    """A function-level `import core...` is a circle in disguise: only modules with a heavy package load lazily."""
    rel = str(path.relative_to(ROOT))
    if rel.startswith(EDGES):
        return
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = set(map(id, tree.body))
    lazy = set()
    for node in _walk_runtime(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            lazy |= {n for n in names if n.split(".")[0] == "core"}
    assert lazy <= set(HEAVY), f"function-level core imports in {rel}: {sorted(lazy - set(HEAVY))}"


def _resolves(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_core_name_in_a_message_or_docstring_exists():
    """`core.xxx` written in any string, docstring or comment of core/ names a module or attribute that exists
    (stale names such as core.annotate.Gate or core.CACHES.max_bytes mislead users)."""
    import re
    import warnings

    found: dict[str, str] = {}
    for path in sorted(CORE.rglob("*.py")):
        for match in re.finditer(r"(?<![\w./])core\.[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*", path.read_text(encoding="utf-8")):
            found.setdefault(match.group(0).rstrip("."), str(path.relative_to(ROOT)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        missing = sorted(f"{name} ({where})" for name, where in found.items() if not _resolves(name))
    assert not missing, f"names that do not exist: {missing}"
