"""Many continuations of one trace from one position, decoded as one batch.

Row i keeps the trace's first `pos` tokens, lets `who[i]` ("reason" or "base") write token `pos`, and
continues under `then` (the trace's own policy, or the base alone) with its own sampling seed. The
prompt and prefix are read once (or taken from the trace's held caches) and shared by every row.
Each row is a child trace of `trace` (meta parent / branch_pos), keyed by its request, so a store
returns it on a re-run without decoding.

This is the batched stand-in for `core.takeover(pair, trace, {pos: who}, then=...)` (issue 21); the one
caller is `core.instruments.effects._continue`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core import settings
from core.decoding.engine import Decoder, Row
from core.decoding.policies import (
    REASON,
    BaseOnly,
    Policy,
    Step,
    policy_from_record,
    row_identity,
)
from core.decoding.sampling import Sampling, row_seed
from core.decoding.takeover import resume
from core.errors import InvalidInputError, PairMismatchError
from core.evaluation.grading import grade_trace, graded_put
from core.pair.loading import SIDES, ModelPair
from core.scoring.registry import score_values
from core.scoring.teacher_forced import assemble, make_meta
from core.trace import Trace

WHO = ("reason", "base")  # who writes the switched token
THEN = ("policy", "base")  # who decides after it: the trace's own policy, or the base alone


@dataclass
class SwitchPolicy(Policy):
    """At `pos`, row i is written by the reasoner where `reason_rows[i]`, else by the base; elsewhere `then`."""

    then: Policy = field(default_factory=BaseOnly)
    pos: int = 0
    reason_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    name = "switch"

    def __post_init__(self) -> None:
        self.score = self.then.score
        self.lazy = self.then.lazy  # type: ignore[misc]

    def takeover(self, step: Step) -> np.ndarray:
        if step.t == self.pos:
            return self.reason_rows.copy()
        return self.then.takeover(step)

    def forced_token(self, t: int) -> int | None:
        return None if t == self.pos else self.then.forced_token(t)


def then_policy(trace: Trace, then: str) -> Policy:
    """The policy that decides after the switch: the trace's own (rebuilt from its record) or BaseOnly."""
    if then not in THEN:
        raise InvalidInputError(f"Unknown then={then!r}; choose one of: {', '.join(THEN)}")
    record = trace.meta.get("policy")
    if then == "base" or not record:
        return BaseOnly()
    return policy_from_record(record)


def continuation_sampling(trace: Trace, temperature: float, max_new_tokens: int | None) -> Sampling:
    """The trace's top-p, stop strings and length limit (or `max_new_tokens`) at `temperature`."""
    parent = trace.meta.get("sampling") or {}
    return Sampling(temperature=float(temperature), top_p=parent.get("top_p", settings.TOP_P), seed=0,
                    max_new_tokens=max_new_tokens or parent.get("max_new_tokens") or len(trace) + settings.MAX_NEW_TOKENS,
                    stop=tuple(parent.get("stop", ())))


def _rows(pair: ModelPair, trace: Trace, pos: int, who: Sequence[str], seeds: Sequence[int], then: str,
          temperature: float, max_new_tokens: int | None) -> tuple[list[Row], Policy, Sampling, int]:
    """The checked decoding rows of a batch of continuations, the policy after the switch, sampling and k."""
    if len(who) != len(seeds):
        raise InvalidInputError(f"who has {len(who)} entries and seeds {len(seeds)}; give one of each per row")
    bad = [w for w in who if w not in WHO]
    if bad:
        raise InvalidInputError(f"Unknown who={bad[0]!r}; choose one of: {', '.join(WHO)}")
    if (trace.meta.get("request") or {}).get("pair") not in (None, pair.fingerprint()):
        raise PairMismatchError("This trace was made with a different model pair or prompt formats; "
                                "load the pair it records in meta['pair'] to continue it")
    if not isinstance(pos, (int, np.integer)) or not 0 <= pos < len(trace):
        raise InvalidInputError(f"Position {pos!r} is outside the trace (0..{len(trace) - 1})")
    policy = then_policy(trace, then)
    sampling = continuation_sampling(trace, temperature, max_new_tokens)
    k = trace.k or settings.K
    return [_row(pair, trace, int(pos), w, int(s), policy, sampling, k) for w, s in zip(who, seeds)], policy, sampling, k


def continuation_keys(pair: ModelPair, trace: Trace, pos: int, who: Sequence[str], seeds: Sequence[int], *,
                      then: str = "policy", temperature: float, max_new_tokens: int | None = None) -> list[str]:
    """The store keys `continue_batch` gives its rows, in row order (tokenising the prompt is all it does)."""
    rows, *_ = _rows(pair, trace, pos, who, seeds, then, temperature, max_new_tokens)
    return [row.meta["key"] for row in rows]


def continue_batch(pair: ModelPair, trace: Trace, pos: int, who: Sequence[str], seeds: Sequence[int], *,
                   then: str = "policy", temperature: float, max_new_tokens: int | None = None, store: Any = None,
                   lookahead: int | None = None, should_stop: Callable[[], bool] | None = None,
                   on_trace: Callable[[Trace], Any] | None = None) -> list[Trace]:
    """One graded child trace per (who[i], seeds[i]), decoded together; stored ones are read back (None
    for a row whose key the store holds but cannot give, as an executor's skip-list does). `on_trace`
    runs on each new child before it is graded and stored."""
    rows, policy, sampling, k = _rows(pair, trace, pos, who, seeds, then, temperature, max_new_tokens)
    pos = int(pos)
    out: list[Trace | None] = [None] * len(rows)
    todo = []
    for i, row in enumerate(rows):
        if store is not None and row.meta["key"] in store:
            stored = store.get(row.meta["key"])
            out[i] = None if stored is None else graded_put(store, stored)
        else:
            todo.append(i)
    if todo:
        batch = [rows[i] for i in todo]
        if batch[0].prompt_ids != trace.prompt_ids:
            raise PairMismatchError("The pair formats this problem differently from the trace's recorded prompt")
        prefix = [int(x) for x in trace.token_ids[:pos]]
        gate_values = trace.metrics["entropy_base"] if policy.lazy else score_values(trace.metrics, policy.score)
        for row in batch:
            row.tokens, row.source = list(prefix), [str(x) for x in trace.source[:pos]]
            row.history = [float(x) for x in np.asarray(gate_values)[:pos]]
        states = resume(pair, trace, batch[0], prefix)  # one read of prompt + prefix (or the held caches)
        for side in SIDES:
            states[side].repeat(len(batch))
        plan = SwitchPolicy(policy, pos, np.array([r.meta["branch"]["who"] == REASON for r in batch]))
        t0 = time.perf_counter()
        arrays = Decoder(pair, batch, plan, sampling, k, lookahead=lookahead, states=states, start=pos,
                         should_stop=should_stop).run()
        elapsed = round(time.perf_counter() - t0, 4)
        for j, (i, row) in enumerate(zip(todo, batch)):
            row.meta["timings"] = {"generate_s": elapsed, "batch": len(batch)}
            child = assemble(pair, row.tokens, row.prompt_ids, arrays[j], row.source, row.meta, parent=trace, keep=pos)
            if on_trace is not None:
                on_trace(child)
            out[i] = graded_put(store, child) if store is not None else _graded(child)
    return out  # type: ignore[return-value]


@dataclass(frozen=True, eq=False)
class ContinueJob:
    """A job kind for `core.scale`'s executors (see `core.scale.jobs`): `continue_batch`'s rows of one trace
    from one position, one decoding batch wherever it runs, so the rows are the same on any worker."""

    trace: Trace
    pos: int
    who: tuple[str, ...]
    seeds: tuple[int, ...]
    then: str = "policy"
    temperature: float = 0.0
    max_new_tokens: int | None = None

    @property
    def units(self) -> int:
        """Rows in the job: one continuation each."""
        return len(self.who)

    def keys(self, pair: ModelPair) -> list[str]:
        """The rows' store keys, in row order (no model forward)."""
        return continuation_keys(pair, self.trace, self.pos, self.who, self.seeds, then=self.then,
                                 temperature=self.temperature, max_new_tokens=self.max_new_tokens)

    def make(self, pair: ModelPair, store: Any, on_trace: Callable[[Trace], Any] | None = None) -> list[Trace | None]:
        """The graded rows (None where `store` holds the key but gives nothing back), new ones put in `store`."""
        return continue_batch(pair, self.trace, self.pos, self.who, self.seeds, then=self.then,
                              temperature=self.temperature, max_new_tokens=self.max_new_tokens, store=store,
                              on_trace=on_trace)


def _graded(trace: Trace) -> Trace:
    grade_trace(trace)
    return trace


def _row(pair: ModelPair, trace: Trace, pos: int, who: str, seed: int, then: Policy, sampling: Sampling,
         k: int) -> Row:
    """The decoding row of one continuation, with its request (its store key) and meta."""
    problem = trace.meta.get("problem") or {"prompt": ""}
    prompt_ids = pair.prompt_ids(problem["prompt"])
    row_sampling = Sampling(sampling.temperature, sampling.top_p, seed, sampling.max_new_tokens, sampling.stop)
    policy = {**then.record(), "branch": {"pos": pos, "token": who}}
    request = {"kind": "branch", "pair": pair.fingerprint(), "prompt": problem["prompt"], "policy": policy,
               "sampling": row_sampling.record(0), "k": k, "parent": trace.key, "branch_pos": pos, "token": None,
               "takeover": {str(pos): who}}
    meta = make_meta(pair, kind="branch", request=request, problem=problem, policy=policy,
                     sampling=row_sampling.record(0), parent=trace.key, branch_pos=pos,
                     branch={"pos": pos, "who": who})
    room = pair.check_context(prompt_ids, sampling.max_new_tokens)
    parent_sample = int((trace.meta.get("sampling") or {}).get("sample", 0))
    # the trace's policy draws its per-row randomness (RandomPositions) as it did for the trace
    return Row(problem, prompt_ids, meta, row_seed(row_sampling, 0), room=room if room < sampling.max_new_tokens else None,
               identity=row_identity(problem["prompt"], parent_sample))
