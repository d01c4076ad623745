"""What the app's buttons do, as plain functions over core: build policies, generate, branch, grade, store.

No streamlit here; callers pass a `progress(done, total)` callback and turn ForkpointError into messages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import core
from core.decoding.engine import branch, generate
from core.errors import InvalidInputError
from core.evaluation.grading import extract_answer, grade
from core.decoding.policies import BaseOnly, EarlyOnly, EntropyGated, Guided, Policy, RandomPositions, ReasonOnly
from core.evaluation.problems import Problem
from core.io.store import TraceStore
from core.trace import Trace

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
FIRST_VIEW_TOKENS = 256  # max new tokens of the trace generated for the first view

# Policies offered on the Generate page: name -> (label, parameters it takes).
POLICY_CHOICES: dict[str, tuple[str, tuple[str, ...]]] = {
    "base_only": ("BaseOnly: the base writes every token", ()),
    "guided": ("Guided: calibrated disagreement gate, within a budget", ("budget", "ratio", "window")),
    "entropy_gated": ("EntropyGated: take over where base entropy > threshold", ("budget", "threshold")),
    "random_positions": ("RandomPositions: random takeovers at a rate (baseline)", ("rate", "seed")),
    "early_only": ("EarlyOnly: the reasoner writes the first tokens (baseline)", ("rate",)),
    "reason_only": ("ReasonOnly: the reasoner writes everything (upper bound)", ()),
}


@dataclass
class PolicyRequest:
    """Widget values for one policy; `build` turns them into a core policy (calibrating Guided's gate)."""

    name: str = "base_only"
    budget: float = 0.1  # max share of tokens taken over
    ratio: float = 0.05  # Guided: target takeover ratio r for calibration
    window: int = 16  # Guided: W
    threshold: float = 1.0  # EntropyGated: nats
    rate: float = 0.05  # RandomPositions / EarlyOnly
    seed: int = 0
    score: str = core.DEFAULT_SCORE
    extra: dict[str, Any] = field(default_factory=dict)

    def build(self, pair: core.ModelPair | None = None, calibration: Sequence[Any] = (), store: TraceStore | None = None,
              max_new_tokens: int = 256, progress: Progress | None = None) -> Policy:
        """The core policy; Guided calibrates its gate on base rollouts of `calibration` problems."""
        if self.name == "base_only":
            return BaseOnly()
        if self.name == "reason_only":
            return ReasonOnly()
        if self.name == "entropy_gated":
            return EntropyGated(threshold=self.threshold, budget=self.budget)
        if self.name == "random_positions":
            return RandomPositions(rate=self.rate, seed=self.seed)
        if self.name == "early_only":
            return EarlyOnly(rate=self.rate)
        if self.name == "guided":
            if pair is None or not calibration:
                raise InvalidInputError("Guided needs problems to calibrate its gate on")
            gate = core.calibrate(pair, list(calibration), ratio=self.ratio, window=self.window, score=self.score,
                                  max_new_tokens=max_new_tokens, store=store, progress=progress)
            return Guided.from_gate(gate, budget=self.budget, score=self.score)
        raise InvalidInputError(f"Unknown policy {self.name!r}; choose one of: {', '.join(POLICY_CHOICES)}")


def graded(trace: Trace) -> Trace:
    """Fill meta answer/correct from the problem's gold answer (when known and not yet graded)."""
    gold = (trace.meta.get("problem") or {}).get("gold")
    if gold is None or str(gold).strip() == "" or trace.meta.get("correct") is not None:
        return trace
    trace.meta["answer"] = extract_answer(trace.text)
    trace.meta["correct"] = bool(grade(trace.text, str(gold)))
    return trace


def graded_put(store: TraceStore, trace: Trace) -> Trace:
    """Grade (if possible) and store; an already-graded stored trace is left as it is."""
    was_graded = trace.meta.get("correct") is not None
    trace = graded(trace)
    store.put(trace, overwrite=not was_graded and trace.meta.get("correct") is not None)
    return trace


def first_trace(pair: core.ModelPair, store: TraceStore, problem: Problem,
                max_new_tokens: int = FIRST_VIEW_TOKENS) -> Trace:
    """The greedy BaseOnly trace of `problem` (from the store when it is already there)."""
    trace = generate(pair, problem, BaseOnly(), max_new_tokens=max_new_tokens, store=store)
    return graded_put(store, trace)


def showcase_trace(pair: core.ModelPair, store: TraceStore, problems: Sequence[Problem], look: int = 8,
                   max_new_tokens: int = FIRST_VIEW_TOKENS) -> Trace:
    """The first view: greedy BaseOnly traces of the first `look` problems (one batch, stored), and of
    those the first the base model gets wrong (the interesting case), else the first."""
    if not problems:
        raise InvalidInputError("No problems to show")
    traces = generate(pair, list(problems[:look]), BaseOnly(), max_new_tokens=max_new_tokens, store=store)
    traces = [graded_put(store, t) for t in traces]
    return next((t for t in traces if t.meta.get("correct") is False), traces[0])


def run_branch(pair: core.ModelPair, store: TraceStore, parent: Trace, pos: int, token: int | None = None,
               max_new_tokens: int | None = None, progress: Progress | None = None) -> Trace:
    """Take over at `pos` (the reasoner's choice, or `token`), continue with the base, grade, store."""
    limit = None
    if max_new_tokens is not None:
        limit = max(int(max_new_tokens), pos + 1)
    child = branch(pair, parent, int(pos), token=token, max_new_tokens=limit, store=store, progress=progress)
    return graded_put(store, child)


def run_generate(pair: core.ModelPair, store: TraceStore, problems: Sequence[Problem], policy: Policy, *,
                 max_new_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                 samples: int = 1, batch_size: int = 4, progress: Progress | None = None) -> list[Trace]:
    """Run `policy` on `problems` in batches; each trace is graded and stored. progress(done, total) in rows."""
    if not problems:
        raise InvalidInputError("Choose at least one problem")
    total = len(problems) * samples
    out: list[Trace] = []
    for start in range(0, len(problems), batch_size):
        chunk = list(problems[start:start + batch_size])
        done_before = len(out)

        def step(t: int, limit: int, _before: int = done_before, _rows: int = len(chunk) * samples) -> None:
            if progress is not None:
                progress(_before + int(_rows * t / max(limit, 1)), total)

        traces = generate(pair, chunk, policy, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                          seed=seed, samples=samples, store=store, progress=step)
        out += [graded_put(store, t) for t in traces]
        if progress is not None:
            progress(len(out), total)
    return out
