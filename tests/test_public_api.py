"""`import core`: a small grouped API, no name that hides a module, every exception in core.errors, and no
UI, CLI or heavy optional library pulled in by the import."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import core
import core.errors

ROOT = Path(__file__).resolve().parents[1]
CORE_FILES = sorted((ROOT / "core").rglob("*.py"))


def test_the_api_is_small_and_complete() -> None:
    assert len(core.__all__) == len(set(core.__all__)) and len(core.__all__) <= 40
    for name in core.__all__:
        assert getattr(core, name) is not None, name
    for name in ("Policy", "make_policy", "list_policies", "list_metrics", "Gate", "calibrate", "generate",
                 "branch", "score", "load_pair", "TraceStore", "export", "evaluate", "ForkpointError"):
        assert name in core.__all__, name
    assert set(dir(core)) >= set(core.__all__)


def test_mutable_internals_are_not_public() -> None:
    for name in ("CACHES", "METRICS", "SCORES", "analysis"):
        assert name not in core.__all__
    assert not hasattr(core, "CACHES")  # the branch cache lives in core.decoding, not on the package


def test_registry_functions_return_the_registries() -> None:
    from core.decoding.policies import POLICIES
    from core.scoring.registry import METRICS

    assert [s.name for s in core.list_policies(include_internal=True)] == list(POLICIES)
    assert [m.name for m in core.list_metrics()] == list(METRICS)
    assert isinstance(core.make_policy("early_only", rate=0.5), core.Policy)


def _submodules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(core.__path__, "core.") if ".cli" not in m.name
                  and not m.name.startswith("core.scale.ray"))


def test_no_public_name_is_a_module_name() -> None:
    """`core.<name>` is never both a function and a module (the old `core.evaluate` hid its module)."""
    top = {m.name for m in pkgutil.iter_modules(core.__path__)}
    clash = sorted(set(core.__all__) & top)
    assert not clash, f"public names that are also modules under core/: {clash}"
    for name in core.__all__:
        try:
            importlib.import_module("core." + name)
        except ModuleNotFoundError:
            continue
        pytest.fail(f"core.{name} is both a public name and an importable module")


def test_importing_a_submodule_never_rebinds_a_public_name() -> None:
    before = {name: getattr(core, name) for name in core.__all__ if name not in ("tag_planning", "grade")}
    for sub in _submodules():
        try:
            importlib.import_module(sub)
        except ImportError as err:  # an optional extra that is not installed
            if "core" in str(getattr(err, "name", "") or ""):
                raise
    for name, value in before.items():
        assert getattr(core, name) is value, f"importing submodules rebound core.{name}"
    for m in pkgutil.iter_modules(core.__path__):
        mod = sys.modules.get("core." + m.name)
        if mod is not None:
            assert getattr(core, m.name) is mod, f"core.{m.name} is not the module core/{m.name}"


def _exception_classes() -> list[tuple[Path, str, int]]:
    """(file, class, line) of every class in core/ whose base looks like an exception."""
    out = []
    for path in CORE_FILES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
                if any(b.endswith(("Error", "Exception", "Cancelled")) or b in ("ForkpointError",) for b in bases):
                    out.append((path, node.name, node.lineno))
    return out


def test_every_exception_type_lives_in_errors_and_is_exported() -> None:
    found = _exception_classes()
    assert found, "the scan found no exception class at all"
    elsewhere = [f"{p.relative_to(ROOT)}:{line} {name}" for p, name, line in found if p.name != "errors.py"]
    assert not elsewhere, f"exception classes outside core/errors.py: {elsewhere}"
    classes = [c for _, c in inspect.getmembers(core.errors, inspect.isclass) if issubclass(c, Exception)]
    for cls in classes:
        assert issubclass(cls, core.errors.ForkpointError) and cls.__doc__, cls
        assert getattr(core, cls.__name__) is cls, f"core.{cls.__name__} does not reach core.errors.{cls.__name__}"
    assert [c for c in core.__all__ if c.endswith("Error")] == ["ForkpointError", "InvalidInputError"]


def test_core_raises_no_bare_forkpoint_or_value_error() -> None:
    """A specific type from core.errors fits every deliberate raise; InvalidInputError is the ValueError."""
    bare = []
    for path in CORE_FILES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                name = ast.unparse(node.exc.func)
                if name in ("ForkpointError", "ValueError", "Exception"):
                    bare.append(f"{path.relative_to(ROOT)}:{node.lineno} raise {name}(...)")
    assert not bare, bare


def test_import_core_loads_no_ui_cli_or_lazy_library() -> None:
    code = (
        "import json, sys; import core; core.make_policy('base_only'); core.list_metrics(); "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'streamlit', 'click', 'typer', 'spacy', 'math_verify', 'ray'})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True,
                         cwd=ROOT)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_import_jsonl_is_a_deprecated_alias() -> None:
    with pytest.warns(DeprecationWarning, match="core.import_file"):
        assert core.import_jsonl is core.import_file


def test_documented_old_module_paths_are_deprecated_aliases() -> None:
    """Paths the docs once gave keep working, with a warning naming the new home."""
    code = ("import warnings, json; warnings.simplefilter('always'); import core\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    warnings.simplefilter('always')\n"
            "    from core.scoring.comparison import with_reasoner\n"
            "    from core.evaluation.records import RecordTable\n"
            "import core.analysis.comparison as new, core.evaluation.record_table as table\n"
            "print(json.dumps([with_reasoner is new.with_reasoner, RecordTable is table.RecordTable,\n"
            "                  new.__name__, [str(w.message) for w in seen if w.category is DeprecationWarning]]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True, cwd=ROOT)
    same, same_table, name, warned = json.loads(out.stdout.strip().splitlines()[-1])
    assert same and same_table and name == "core.analysis.comparison"
    assert warned == ["core.scoring.comparison moved to core.analysis.comparison; import it from there",
                      "core.evaluation.records moved to core.evaluation.record_table; import it from there"]


def test_import_core_loads_no_model_stack() -> None:
    """`import core` and the store's modules load neither torch nor transformers (file-only commands start fast)."""
    code = ("import json, sys; import core, core.io.store, core.views.exports; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers'})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True, cwd=ROOT)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_lazy_names_resolve() -> None:
    from core.annotate.planning import tag_planning
    from core.evaluation.grading import grade

    assert core.grade is grade and core.tag_planning is tag_planning
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        core.nope  # noqa: B018
