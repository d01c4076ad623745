"""forkpoint core: load a base/reasoning model pair, score and generate token-level disagreement traces.

    import core
    pair = core.load_pair("Qwen/Qwen3-0.6B-Base", "Qwen/Qwen3-8B")
    trace = core.score(pair, "What is 2+3?", "2+3 = 5. The answer is 5.")
    trace.frame()
"""

from core.divergence import DEFAULT_SCORE, METRICS, SCORES
from core.errors import (
    ForkpointError,
    InvalidInputError,
    ModelLoadError,
    PairMismatchError,
    StoreError,
    VocabularyMismatchError,
)
from core.annotate import Gate
from core.decoding import CACHES, GenerationCancelled, branch, calibrate, generate
from core.models import ModelPair, PromptFormat, load_pair
from core.policies import BaseOnly, EarlyOnly, EntropyGated, Forced, Guided, RandomPositions, ReasonOnly
from core.scoring import score, score_batch
from core.trace import Trace

__all__ = [
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
