"""forkpoint core: load a base/reasoning model pair, score and generate token-level disagreement traces.

    import core
    pair = core.load_pair("Qwen/Qwen3-0.6B-Base", "Qwen/Qwen3-8B")
    trace = core.score(pair, "What is 2+3?", "2+3 = 5. The answer is 5.")
    trace.frame()
"""

from core.metrics import DEFAULT_SCORE, METRICS, SCORES
from core.errors import (
    ForkpointError,
    GenerationCancelled,
    InvalidInputError,
    ModelLoadError,
    PairMismatchError,
    StoreError,
    VocabularyMismatchError,
)
from core.analysis import tables as analysis
from core.spike_rules import Gate, calibrate_gate, spikes
from core.decoding.engine import CACHES, branch, calibrate, generate
from core.demo.pair import DEMO_DIR, demo_pair, demo_problems
from core.evaluation.harness import evaluate
from core.io.exports import export, read_jsonl
from core.io.imports import import_jsonl
from core.pair.loading import ModelPair, PromptFormat, load_pair
from core.decoding.policies import BaseOnly, EarlyOnly, EntropyGated, Forced, Guided, RandomPositions, ReasonOnly
from core.evaluation.problems import Problem, load_problems
from core.scoring import score, score_batch
from core.io.store import TraceStore
from core.trace import Trace

__all__ = [
    "DEMO_DIR",
    "demo_pair",
    "demo_problems",
    "evaluate",
    "TraceStore",
    "export",
    "import_jsonl",
    "read_jsonl",
    "PlanningTagger",
    "Problem",
    "analysis",
    "annotate_tags",
    "calibrate_gate",
    "extract_answer",
    "grade",
    "load_problems",
    "segment_tokens",
    "spikes",
    "tag_planning",
    "CACHES",
    "BaseOnly",
    "EarlyOnly",
    "EntropyGated",
    "Forced",
    "Gate",
    "GenerationCancelled",
    "Guided",
    "RandomPositions",
    "ReasonOnly",
    "branch",
    "calibrate",
    "generate",
    "DEFAULT_SCORE",
    "METRICS",
    "SCORES",
    "ForkpointError",
    "InvalidInputError",
    "ModelLoadError",
    "ModelPair",
    "PairMismatchError",
    "PromptFormat",
    "StoreError",
    "Trace",
    "VocabularyMismatchError",
    "load_pair",
    "score",
    "score_batch",
]


# spaCy (which pulls in a CLI framework) and math-verify (sympy) load only when first used.
_LAZY = {
    "PlanningTagger": "core.planning",
    "annotate_tags": "core.planning",
    "segment_tokens": "core.planning",
    "tag_planning": "core.planning",
    "extract_answer": "core.evaluation.grading",
    "grade": "core.evaluation.grading",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'core' has no attribute {name!r}")
