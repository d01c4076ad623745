"""forkpoint core: load a base/reasoning model pair, score and generate token-level disagreement traces.

    import core
    pair = core.load_pair("Qwen/Qwen3-0.6B-Base", "Qwen/Qwen3-8B")
    trace = core.score(pair, "What is 2+3?", "2+3 = 5. The answer is 5.")
    gate = core.calibrate(pair, problems, ratio=0.05)
    guided = core.generate(pair, problems, core.make_policy("guided", gate=gate))
    trace.frame()

Everything else lives in its module (`core.settings` for defaults, `core.metrics`, `core.spike_rules`,
`core.analysis.tables`, `core.io.store`, ...). No public name here equals a module name under `core`.
"""

from core.decoding import branch, calibrate, generate
from core.decoding.policies import (
    BaseOnly,
    EarlyOnly,
    EntropyGated,
    Forced,
    Guided,
    Policy,
    RandomPositions,
    ReasonOnly,
    list_policies,
    make_policy,
)
from core.demo.pair import demo_pair, demo_problems
from core.errors import (
    ExecutorError,
    ForkpointError,
    GenerationCancelled,
    GradingError,
    InvalidInputError,
    ModelLoadError,
    OutputExistsError,
    PairMismatchError,
    StoreError,
    VocabularyMismatchError,
    WriteError,
)
from core.evaluation.harness import evaluate
from core.evaluation.problems import Problem, load_problems
from core.io.exports import export, read_jsonl
from core.io.imports import import_jsonl
from core.io.store import TraceStore
from core.metrics import list_metrics
from core.pair.loading import ModelPair, load_pair
from core.scoring import score, score_batch
from core.spike_rules import Gate, spikes
from core.trace import Trace

__all__ = [  # noqa: RUF022  (grouped by pipeline stage, not sorted)
    # 1. a model pair (and the bundled demo pair)
    "load_pair", "ModelPair", "demo_pair",
    # 2. problems
    "Problem", "load_problems", "demo_problems",
    # 3. traces: score a given response, generate new ones, branch at a token
    "Trace", "score", "score_batch", "generate", "branch", "compare",
    # 4. who writes each token: the policy registry, the calibrated gate, the built-in policies
    "Policy", "make_policy", "list_policies", "Gate", "calibrate",
    "BaseOnly", "ReasonOnly", "Guided", "EntropyGated", "RandomPositions", "EarlyOnly", "Forced",
    # 5. metrics and annotations
    "list_metrics", "spikes", "tag_planning",
    # 6. the store and files others open
    "TraceStore", "export", "read_jsonl", "import_jsonl",
    # 7. evaluation
    "evaluate", "grade", "reproduce",
    # 8. errors (all in core.errors; catch ForkpointError for every user mistake)
    "ForkpointError", "InvalidInputError", "ModelLoadError", "VocabularyMismatchError", "PairMismatchError",
    "StoreError", "WriteError", "OutputExistsError", "GradingError", "GenerationCancelled", "ExecutorError",
]  # fmt: skip


# spaCy (which pulls in a CLI framework) and math-verify (sympy) load only when first used.
_LAZY = {
    "tag_planning": "core.planning",
    "grade": "core.evaluation.grading",
    "reproduce": "core.evaluation.reproduce",
    "compare": "core.comparison",  # several reasoners against one base (core/comparison.py)
    "widget": "core.notebook",  # needs the `notebook` extra (anywidget); not in __all__ for that reason
    "RayExecutor": "core.scale",  # scale-out on Ray (the `ray` extra; docs/SCALE.md); Ray loads only when used
    # research instruments (core/instruments/): outside __all__, which is at its size limit
    "takeover_effects": "core.instruments", "success_curve": "core.instruments",
    "lens": "core.instruments.lens", "token_stats": "core.instruments.token_stats",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'core' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
