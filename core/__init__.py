"""forkpoint core: load a base/reasoning model pair, score and generate token-level disagreement traces.

    import core
    pair = core.demo_pair()                                # or core.load_pair("Qwen/Qwen3-0.6B-Base", "Qwen/Qwen3-8B")
    trace = core.score(pair, "What is 2+3?", "2+3 = 5. The answer is 5.")
    trace.frame()

The folders read as the pipeline, each importing only those before it (docs/ARCHITECTURE.md, checked by
tests/test_architecture.py): `pair/` -> `record/` -> `scoring/` -> `annotate/` -> `decoding/` -> `io/` -> `evaluation/` ->
`views/` -> `analysis/` -> `instruments/` -> `demo/` -> `reports/` -> `scale/` -> `notebook/`, `cli/`.
Every public name below loads its module on first use, so `import core` (and a command that only reads
files) starts without the model stack. No public name equals a module name under `core`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from typing import Any

from core import trace as _trace

# name -> the module that defines it, grouped by pipeline stage (the order of __all__).
_PUBLIC: dict[str, str] = {
    # 1. a model pair (and the bundled demo pair)
    "load_pair": "core.pair.loading", "ModelPair": "core.pair.loading", "demo_pair": "core.demo.pair",
    # 2. problems
    "Problem": "core.evaluation.problems", "load_problems": "core.evaluation.problems",
    "demo_problems": "core.demo.pair",
    # 3. traces: score a given response, generate new ones, switch takeovers on and off
    "Trace": "core.trace", "score": "core.scoring.teacher_forced", "score_batch": "core.scoring.teacher_forced",
    "compare": "core.analysis.comparison", "generate": "core.decoding.generation",
    "takeover": "core.decoding.takeover", "branch": "core.decoding.takeover",
    # 4. who writes each token: the policy registry and the calibrated gate
    "Policy": "core.decoding.policies", "make_policy": "core.decoding.policies",
    "build_policy": "core.decoding.calibration", "list_policies": "core.decoding.policies",
    "Gate": "core.annotate.spikes", "calibrate": "core.decoding.calibration",
    # 5. metrics, annotations, analyses
    "list_metrics": "core.scoring.registry", "spikes": "core.annotate.spikes",
    "tag_planning": "core.annotate.planning", "list_analyses": "core.analysis.registry",
    # 6. the store and files others open
    "TraceStore": "core.io.store", "import_file": "core.evaluation.graded_import", "export": "core.views.exports",
    "read_jsonl": "core.views.exports",
    # 7. evaluation
    "evaluate": "core.evaluation.harness", "grade": "core.evaluation.grading", "reproduce": "core.reports.reproduce",
    "compare_gates": "core.reports.gates",
    # 8. research instruments: does a takeover matter, where is success decided, where does a decision form
    "takeover_effects": "core.instruments.effects", "success_curve": "core.instruments.success_curve",
    "lens": "core.instruments.lens", "token_stats": "core.instruments.token_stats",
    "train_router": "core.instruments.router_training",
    # 9. errors: every other type is in core.errors; catch ForkpointError for every user mistake
    "ForkpointError": "core.errors", "InvalidInputError": "core.errors",
}  # fmt: skip

# Reachable as `core.<name>` for code written against earlier versions, but not part of the grouped API.
_MORE: dict[str, str] = {
    **{name: "core.decoding.policies" for name in (
        "BaseOnly", "ReasonOnly", "Guided", "EntropyGated", "RandomPositions", "EarlyOnly", "Forced")},
    **{name: "core.errors" for name in (
        "ModelLoadError", "VocabularyMismatchError", "PairMismatchError", "StoreError", "WriteError",
        "OutputExistsError", "GradingError", "GenerationCancelled", "ExecutorError")},
    "widget": "core.notebook.widget",  # needs the `notebook` extra (anywidget)
    "RayExecutor": "core.scale.ray_executor",  # needs the `ray` extra (docs/SCALE.md)
}  # fmt: skip

_DEPRECATED = {"import_jsonl": "import_file"}  # old name -> new name (same function)

# Module paths the docs once gave, moved into the room of their stage: importing the old path warns and gives
# the new module's names (a stand-in module, so the moved module keeps its own name).
_MOVED_MODULES = {"core.scoring.comparison": "core.analysis.comparison",
                  "core.evaluation.records": "core.evaluation.record_table"}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds only the old paths in `_MOVED_MODULES`, after every real module (nothing on disk has those names)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(name, self) if name in _MOVED_MODULES else None

    def create_module(self, spec: Any) -> types.ModuleType:
        new = _MOVED_MODULES[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        module = types.ModuleType(spec.name, f"Deprecated alias of {new}.")
        target = importlib.import_module(new)
        module.__getattr__ = lambda attr: getattr(target, attr)  # type: ignore[method-assign]
        module.__dir__ = lambda: dir(target)  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())

__all__ = list(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        warnings.warn(f"core.{name} is deprecated; use core.{_DEPRECATED[name]} (it reads JSONL, CSV and Parquet)",
                      DeprecationWarning, stacklevel=2)
        name = _DEPRECATED[name]
    module = _PUBLIC.get(name) or _MORE.get(name)
    if module is None:
        raise AttributeError(f"module 'core' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC) | set(_MORE))


def _repr_html(trace: Any) -> str:
    return importlib.import_module("core.views.display").trace_html(trace)


_trace.register_html_renderer(_repr_html)  # a Trace shows itself in Jupyter without importing the views
