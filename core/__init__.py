"""forkpoint core: load a base/reasoning model pair, score and generate token-level disagreement traces.

    import core
    pair = core.demo_pair()                                # or core.load_pair("Qwen/Qwen3-0.6B-Base", "Qwen/Qwen3-8B")
    trace = core.score(pair, "What is 2+3?", "2+3 = 5. The answer is 5.")
    trace.frame()

The folders read as the pipeline (docs/ARCHITECTURE.md): `pair/` -> `scoring/` -> `decoding/` ->
`annotate/` -> `io/` -> `views/` -> `analysis/`, `evaluation/`, `instruments/` -> `scale/`, `cli/`.
Every public name below loads its module on first use, so `import core` (and a command that only reads
files) starts without the model stack. No public name equals a module name under `core`.
"""

from __future__ import annotations

import importlib
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
    "compare": "core.scoring.comparison", "generate": "core.decoding.generation",
    "takeover": "core.decoding.takeover", "branch": "core.decoding.takeover",
    # 4. who writes each token: the policy registry and the calibrated gate
    "Policy": "core.decoding.policies", "make_policy": "core.decoding.policies",
    "build_policy": "core.decoding.calibration", "list_policies": "core.decoding.policies",
    "Gate": "core.annotate.spikes", "calibrate": "core.decoding.calibration",
    # 5. metrics, annotations, analyses
    "list_metrics": "core.scoring.registry", "spikes": "core.annotate.spikes",
    "tag_planning": "core.annotate.planning", "list_analyses": "core.analysis.registry",
    # 6. the store and files others open
    "TraceStore": "core.io.store", "import_file": "core.io.imports", "export": "core.views.exports",
    "read_jsonl": "core.views.exports",
    # 7. evaluation
    "evaluate": "core.evaluation.harness", "grade": "core.evaluation.grading", "reproduce": "core.evaluation.reproduce",
    "compare_gates": "core.evaluation.gates",
    # 8. research instruments: does a takeover matter, where is success decided, where does a decision form
    "takeover_effects": "core.instruments.effects", "success_curve": "core.instruments.effects",
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
    "widget": "core.views.notebook",  # needs the `notebook` extra (anywidget)
    "RayExecutor": "core.scale.ray_executor",  # needs the `ray` extra (docs/SCALE.md)
}  # fmt: skip

_DEPRECATED = {"import_jsonl": "import_file"}  # old name -> new name (same function)

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
