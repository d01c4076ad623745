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
ROOT_MODULES = {"__init__.py", "errors.py", "settings.py", "packaged.py", "trace.py"}  # what every stage shares
ROOMS = {"pair", "record", "scoring", "decoding", "annotate", "io", "views", "analysis", "evaluation", "instruments",
         "scale", "demo", "reports", "notebook", "cli"}


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
    "core.notebook.widget": "anywidget",
    "core.reports.report": "plotly",
    "core.reports.paper": "plotly",
    "core.reports.gates_report": "plotly",
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


# The rooms of core in pipeline order (docs/ARCHITECTURE.md lists them in this order): a room may import from
# the rooms before it, never from one after it. `core` is the package's own __init__ (the lazy public API).
ROOM_ORDER = ("core.errors", "core.settings", "core.packaged", "core.trace", "core.pair", "core.record", "core.scoring",
              "core.annotate", "core.decoding", "core.io", "core.evaluation", "core.views", "core.analysis",
              "core.instruments", "core.demo", "core.reports", "core.scale", "core.notebook", "core", "core.cli")
SHARED = {"core.errors", "core.settings"}  # a leaf module importing only these may be imported from any room


def room_of(module: str, modules: dict[str, Path]) -> str:
    """The folder-level node of a module: its subpackage (core.io for core.io.store), or the root module itself."""
    parts = module.split(".")
    if len(parts) <= 2:
        return module
    return ".".join(parts[:2])


def room_graph(graph: dict[str, set[str]], modules: dict[str, Path]) -> tuple[dict[str, set[str]], dict]:
    """room -> the rooms it imports, and (room, room) -> the module edges behind it. An edge into a leaf module
    (one that imports nothing of core but errors and settings) does not count: a leaf sits in no stage."""
    leaves = {m for m in modules if graph.get(m, set()) <= SHARED}
    rooms: dict[str, set[str]] = defaultdict(set)
    why: dict[tuple[str, str], list[str]] = defaultdict(list)
    for a, targets in graph.items():
        for b in targets:
            ra, rb = room_of(a, modules), room_of(b, modules)
            if ra != rb and b not in leaves:
                rooms[ra].add(rb)
                why[(ra, rb)].append(f"{a} -> {b}")
    return rooms, why


def test_rooms_of_core_import_each_other_without_a_cycle():
    """Stage order at folder level: each subpackage and each root module is a node; no circle of rooms."""
    modules = module_names()
    rooms, why = room_graph(import_graph(modules), modules)
    loops = cycles(rooms)
    detail = "\n".join(
        f"{loop}:\n" + "\n".join(f"  {a} -> {b}: {', '.join(sorted(why[(a, b)]))}"
                                  for a in loop for b in sorted(rooms[a]) if b in loop) for loop in loops
    )
    assert not loops, f"rooms of core that import each other in a circle:\n{detail}"


def test_rooms_import_only_rooms_before_them():
    """The order docs/ARCHITECTURE.md lists is the import order: no room imports a room listed after it."""
    modules = module_names()
    rooms, why = room_graph(import_graph(modules), modules)
    known = {room_of(m, modules) for m in modules}
    assert known <= set(ROOM_ORDER), f"rooms missing from ROOM_ORDER: {sorted(known - set(ROOM_ORDER))}"
    rank = {room: i for i, room in enumerate(ROOM_ORDER)}
    upward = sorted(f"{a} -> {b}: {', '.join(sorted(why[(a, b)]))}"
                    for a, targets in rooms.items() for b in targets if rank[b] > rank[a])
    assert not upward, "imports that climb up the stage order:\n" + "\n".join(upward)


def test_architecture_lists_the_rooms_in_stage_order():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## Rooms in stage order", 1)[1].split("\n## ", 1)[0]
    listed = [line.split("`")[1].rstrip("/").replace("/", ".").removesuffix(".py")
              for line in section.splitlines() if line.startswith(tuple("0123456789")) and "`" in line]
    expected = [r.removeprefix("core.") if r != "core" else "__init__" for r in ROOM_ORDER]
    assert listed == expected, (listed, expected)


def test_the_room_graph_ignores_edges_into_leaves_only():
    modules = {m: Path(f"{m}.py") for m in ("core.a.x", "core.a.y", "core.b.leaf", "core.b.z", "core.errors")}
    graph = {"core.a.x": {"core.b.leaf"}, "core.b.leaf": {"core.errors"}, "core.b.z": {"core.a.y"},
             "core.a.y": {"core.a.x"}}
    rooms, _ = room_graph(graph, modules)
    assert cycles(rooms) == []
    graph["core.a.x"].add("core.b.z")
    rooms, _ = room_graph(graph, modules)
    assert cycles(rooms) == [["core.a", "core.b"]]


MODULE_LOCAL = {"log", "logger"}  # each module's own logger


def top_level_definitions() -> dict[str, list[str]]:
    """Public name -> the core modules (outside the CLI edge, whose commands are named for the API) defining it
    at top level (def, class or assignment; imports are not definitions)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(CORE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel.startswith(EDGES):
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                names = []
            for name in names:
                if not name.startswith("_") and name not in MODULE_LOCAL and rel not in found[name]:
                    found[name].append(rel)
    return found


def test_each_public_name_is_defined_in_one_core_module():
    found = top_level_definitions()
    twice = {name: where for name, where in found.items() if len(where) > 1}
    assert not twice, f"names with two homes (give one a name of its own, or import it): {twice}"


def _streamlit_aliases(tree: ast.AST) -> set[str]:
    """Local names bound to streamlit or one of its modules (`import streamlit as st`, `from streamlit.web
    import server`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "streamlit"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "streamlit":
            names |= {a.asname or a.name for a in node.names}
    return names


STATE_OBJECTS = {"session_state", "query_params"}  # streamlit's documented state: writing into it is the API


def _assigned_into(tree: ast.AST, names: set[str]) -> list[int]:
    """Line numbers of assignments to an attribute of a streamlit module bound to one of `names`
    (`starlette_app.create_streamlit_middleware = ...`, `st.x.y = ...`, `setattr(st, ...)`); writing into
    `st.session_state` or `st.query_params` is streamlit's API, not a patch."""
    lines = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("setattr", "delattr") and node.args:
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        for target in targets:
            chain = []
            while isinstance(target, (ast.Attribute, ast.Subscript)):
                chain.append(target.attr if isinstance(target, ast.Attribute) else "[]")
                target = target.value
            if chain and isinstance(target, ast.Name) and target.id in names and not STATE_OBJECTS & set(chain):
                lines.append(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize("path", sorted((ROOT / "app").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_app_assigns_nothing_into_streamlit_modules(path):
    """The app uses Streamlit's public API (st.App for the live route), never a patched private function."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines = _assigned_into(tree, _streamlit_aliases(tree))
    assert not lines, f"{path.relative_to(ROOT)} assigns into a streamlit module at lines {lines}"


def test_the_streamlit_assignment_check_finds_a_patch():
    tree = ast.parse("from streamlit.web.server.starlette import starlette_app\n"
                     "import streamlit as st\n"
                     "def f():\n    starlette_app.create_streamlit_middleware = g\n"
                     "st.session_state['x'] = 1\nst.query_params.k = 1\nst.x.y = 2\nsetattr(st, 'z', 3)\n")
    assert _assigned_into(tree, _streamlit_aliases(tree)) == [4, 7, 8]


# Every default from settings: a public function's parameter named for a row of core/settings.py takes its
# default from that table, never from a literal written again in the signature.
PROGRESS_SPELLINGS = {"Callable[[int, int], None]": "Progress", "Callable[[str, int, int], None]": "StageProgress"}


def spelled_progress(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, spelling) of every progress callback type written out instead of settings' alias."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            text = ast.unparse(node).removeprefix("collections.abc.").removeprefix("typing.")
            if text in PROGRESS_SPELLINGS:
                found.append((node.lineno, text))
    return sorted(found)


def test_progress_is_spelled_only_in_settings():
    """`Progress` / `StageProgress` (core/settings.py) is the one spelling of the progress protocol."""
    bad = []
    for path in sorted([*CORE.rglob("*.py"), *(ROOT / "app").rglob("*.py")]):
        rel = str(path.relative_to(ROOT))
        if rel == "core/settings.py":
            continue
        hits = spelled_progress(ast.parse(path.read_text(encoding="utf-8")))
        if hits:
            bad += [f"{rel}:{line} {text} (use settings.{PROGRESS_SPELLINGS[text]})" for line, text in hits]
    assert not bad, "progress callbacks spelled out:\n" + "\n".join(bad)


def test_the_progress_check_finds_a_spelling():
    tree = ast.parse("from collections.abc import Callable\nimport typing\n"
                     "def f(p: Callable[[int, int], None] | None = None, q: 'x' = 1) -> None: ...\n"
                     "def g(p: typing.Callable[[str, int,int], None]) -> Callable[[int], None]: ...\n")
    assert spelled_progress(tree) == [(3, "Callable[[int, int], None]"), (4, "Callable[[str, int, int], None]")]


# Parameters that share a settings row's name but mean something else, each with why.
OWN_DEFAULTS = {
    ("core.instruments.lens", "lens", "window"): "the tokens either side of pos, not the gate's window W",
    ("core.instruments.lens", "lens", "k"): "the top predictions shown per layer, not the top-k a trace keeps",
    ("core.demo.pair", "demo_pair", "device"): "the committed demo pair's numbers are measured on a CPU",
    ("core.demo.pair", "demo_pair", "dtype"): "the committed demo pair's numbers are measured in float32",
    ("core.io.jsonsafe", "floats_in", "dtype"): "a numpy dtype of the floats read, not the weights' dtype",
    ("core.reports.gates", "compare_gates", "ratios"): "target takeover rates ρ (settings.GATE_RHOS), not "
                                                       "calibration ratios r",
}


def public_signatures(tree: ast.Module) -> list[tuple[str, ast.FunctionDef]]:
    """(qualified name within the module, def) of its public functions and its public classes' public methods
    (with __init__)."""
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            out.append((node.name, node))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            out += [(f"{node.name}.{m.name}", m) for m in node.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and (m.name == "__init__" or not m.name.startswith("_"))]
    return out


def setting_defaults(tree: ast.Module, names) -> list[tuple[str, str, ast.expr]]:
    """(function, parameter, default expression) for each defaulted parameter named for a setting."""
    out = []
    for qual, fn in public_signatures(tree):
        a = fn.args
        positional = a.posonlyargs + a.args
        pairs = [*zip(positional[len(positional) - len(a.defaults):], a.defaults),
                 *((k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None)]
        out += [(qual, arg.arg, d) for arg, d in pairs if arg.arg in names]
    return out


def _is_literal(node: ast.expr) -> bool:
    """A number or string written in place (None, meaning "filled later" or "off", is no literal setting)."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    if isinstance(node, (ast.Tuple, ast.List)):
        return bool(node.elts) and all(_is_literal(e) for e in node.elts)
    return isinstance(node, ast.Constant) and node.value not in (None, ...) and not isinstance(node.value, bool)


def allowed_defaults(name: str) -> list:
    """What a parameter named `name` may default to: None or () (filled later, or off), its row's value, the
    value of a command's own row (`demo_measure_<name>`, `effect_<name>`), or a named preset's value for it."""
    from core import settings

    values = [None, (), settings.SETTINGS[name].value]
    values += [row.value for key, row in settings.SETTINGS.items() if key.endswith("_" + name)]
    values += [p[name] for p in settings.PRESETS.values() if name in p]
    return values


def test_public_defaults_named_for_a_setting_come_from_settings():
    """A public core signature never writes a setting's value again: `batch_size: int = settings.BATCH_SIZE`,
    not `= 8`; and the value it reads is that setting's (or a command's own row, or a preset's)."""
    import importlib
    import inspect

    from core import settings

    literal, wrong, seen, exempt_seen = [], [], 0, set()
    for path in sorted(CORE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel.startswith(EDGES) or rel == "core/settings.py":
            continue
        module = rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        found = setting_defaults(ast.parse(path.read_text(encoding="utf-8")), settings.SETTINGS)
        if not found:
            continue
        mod = importlib.import_module(module)
        for qual, param, node in found:
            if (module, qual, param) in OWN_DEFAULTS:
                exempt_seen.add((module, qual, param))
                continue
            seen += 1
            if _is_literal(node):
                literal.append(f"{rel}:{node.lineno} {qual}({param}={ast.unparse(node)})")
                continue
            obj = mod
            for part in qual.split("."):
                obj = getattr(obj, part)
            value = inspect.signature(obj).parameters[param].default
            if value not in allowed_defaults(param):
                wrong.append(f"{rel} {qual}({param}={value!r}): settings say {settings.SETTINGS[param].value!r}")
    assert not literal, "literal defaults of settings (read core/settings.py instead):\n" + "\n".join(literal)
    assert not wrong, "defaults that read another setting's value:\n" + "\n".join(wrong)
    assert exempt_seen == set(OWN_DEFAULTS), f"stale OWN_DEFAULTS entries: {sorted(set(OWN_DEFAULTS) - exempt_seen)}"
    assert seen >= 100, seen  # the check sees the API's signatures, not an empty list


def test_the_default_check_finds_a_literal():
    tree = ast.parse("from core import settings\n"
                     "def f(x, batch_size=8, *, seed: int = settings.SEED, k=None, top_p=-1.0) -> None: ...\n"
                     "def _g(batch_size=8): ...\nclass C:\n    def __init__(self, device='auto'): ...\n"
                     "    def _h(self, seed=0): ...\n")
    found = setting_defaults(tree, {"batch_size", "seed", "k", "top_p", "device"})
    assert [(q, p, _is_literal(d)) for q, p, d in found] == [
        ("f", "batch_size", True), ("f", "seed", False), ("f", "k", False), ("f", "top_p", True),
        ("C.__init__", "device", True)]
    assert 8 in allowed_defaults("batch_size") and 100 in allowed_defaults("batch_size")  # demo_measure_batch_size
    assert 7 not in allowed_defaults("batch_size")
