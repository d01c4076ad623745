"""Branching: continue an existing trace from any position with a forced takeover there.

The child keeps the parent's first `pos` tokens (and their metrics), emits the reasoner's choice (or a
given token) at `pos`, and continues under the parent's sampling settings. The model states come from
the parent's held caches when they are there (no forward before the first new token), else from one
prefill of prompt + prefix.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from core import settings
from core.decoding.caches import CACHES, cropped_copy, hold
from core.decoding.engine import Decoder, Row
from core.decoding.generation import Progress, make_rows
from core.decoding.policies import REASON, BaseOnly, Policy, Step
from core.decoding.sampling import Sampling
from core.decoding.state import ModelState
from core.errors import InvalidInputError, PairMismatchError
from core.metrics import score_values
from core.pair.loading import SIDES, ModelPair
from core.scoring import assemble
from core.trace import Trace


@dataclass
class BranchPolicy(Policy):
    """Emit the given token (or the reasoner's choice) at `pos`, then defer to `then`."""

    then: Policy = field(default_factory=BaseOnly)
    pos: int = 0
    token: int | None = None
    name = "branch"

    def __post_init__(self) -> None:
        self.score = self.then.score
        self.lazy = self.then.lazy  # type: ignore[misc]

    def record(self) -> dict[str, Any]:
        return {"name": self.then.name, "params": self.then.record()["params"],
                "branch": {"pos": self.pos, "token": self.token if self.token is not None else REASON}}

    def takeover(self, step: Step) -> np.ndarray:
        if step.t == self.pos:
            return np.full(len(step.taken), self.token is None)
        return self.then.takeover(step)

    def forced_token(self, t: int) -> int | None:
        return self.token if t == self.pos else self.then.forced_token(t)


def _check(pair: ModelPair, trace: Trace, pos: Any, token: int | None) -> None:
    if (trace.meta.get("request") or {}).get("pair") not in (None, pair.fingerprint()):
        raise PairMismatchError("This trace was made with a different model pair or prompt formats; "
                                "load the pair it records in meta['pair'] to branch it")
    if not isinstance(pos, (int, np.integer)) or not 0 <= pos <= len(trace):
        raise InvalidInputError(f"Branch position {pos!r} is outside the trace (0..{len(trace)})")
    if token is not None and not 0 <= int(token) < pair.vocab_size:
        raise InvalidInputError(f"Token id {token} is outside the vocabulary (0..{pair.vocab_size - 1})")


def _sampling(trace: Trace, max_new_tokens: int | None, pos: int) -> Sampling:
    """The parent's sampling settings (a longer limit if asked)."""
    parent = trace.meta.get("sampling") or {}
    sampling = Sampling(
        temperature=parent.get("temperature", settings.TEMPERATURE), top_p=parent.get("top_p", settings.TOP_P),
        seed=parent.get("seed", settings.SEED),
        max_new_tokens=max_new_tokens or parent.get("max_new_tokens") or len(trace) + settings.MAX_NEW_TOKENS,
        stop=tuple(parent.get("stop", ())),
    )
    if pos >= sampling.max_new_tokens:
        raise InvalidInputError(f"Branch position {pos} is at or past max_new_tokens={sampling.max_new_tokens}")
    return sampling


def branch(pair: ModelPair, trace: Trace, pos: int, token: int | None = None, policy: Policy | None = None, *,
           max_new_tokens: int | None = None, lookahead: int | None = None, store: Any = None,
           progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
           temperature: float | None = None, seed: int | None = None) -> Trace:
    """Keep `trace`'s first `pos` tokens, emit at `pos` the reasoner's choice (or `token`), continue with
    `policy` (BaseOnly by default) under the parent's sampling settings (or this branch's own
    `temperature` / `seed`, recorded in its request). Records parent and pos."""
    policy = policy or BaseOnly()
    _check(pair, trace, pos, token)
    sampling = _sampling(trace, max_new_tokens, pos)
    if temperature is not None or seed is not None:
        if temperature is not None and not temperature >= 0:
            raise InvalidInputError(f"temperature must be ≥ 0, got {temperature!r}")
        sampling = replace(sampling, temperature=sampling.temperature if temperature is None else float(temperature),
                           seed=sampling.seed if seed is None else int(seed))
    plan = BranchPolicy(policy, pos, token)
    extra = {"parent": trace.key, "branch_pos": int(pos), "token": None if token is None else int(token)}
    k = trace.k or settings.K
    rows = make_rows(pair, [trace.meta.get("problem") or {"prompt": ""}], 1, plan, sampling, k, kind="branch",
                     extra_request=extra, first_sample=int((trace.meta.get("sampling") or {}).get("sample", 0)))
    row = rows[0]
    row.meta.update(parent=trace.key, branch_pos=int(pos), policy=plan.record())
    if store is not None and row.meta["key"] in store:
        return store.get(row.meta["key"])
    if row.prompt_ids != trace.prompt_ids:
        raise PairMismatchError("The pair formats this problem differently from the trace's recorded prompt")
    prefix_ids = [int(x) for x in trace.token_ids[:pos]]
    row.tokens, row.source = list(prefix_ids), [str(x) for x in trace.source[:pos]]
    # the gate's running mean looks back over the shared prefix, exactly as if the child had written it
    gate_values = trace.metrics["entropy_base"] if plan.lazy else score_values(trace.metrics, plan.score)
    row.history = [float(x) for x in np.asarray(gate_values)[:pos]]
    t0 = time.perf_counter()
    decoder = Decoder(pair, [row], plan, sampling, k, lookahead=lookahead, states=resume(pair, trace, row, prefix_ids),
                      start=pos, progress=progress, should_stop=should_stop)
    arrays = decoder.run()[0]
    row.meta["timings"] = {"generate_s": round(time.perf_counter() - t0, 4), "batch": 1}
    # only the new rows: the prefix's rows (metrics, top-k, display strings) are the parent's, so
    # assembling the child costs the same at any branch position
    child = assemble(pair, row.tokens, row.prompt_ids, arrays, row.source, row.meta, parent=trace, keep=pos)
    hold(child, decoder.states)
    if store is not None:
        store.put(child)
    return child


def resume(pair: ModelPair, trace: Trace, row: Row, prefix_ids: list[int]) -> dict[str, ModelState]:
    """Model states that have read the prompt and `prefix_ids`: cropped held caches, or one prefill each."""
    held = CACHES.get(trace.key)
    pos = len(prefix_ids)
    states = {}
    for side in SIDES:
        p = len(row.prompt_ids[side])
        hidden = held.hidden[side] if held is not None and held.hidden is not None else None
        if hidden is not None and held.prompt_len[side] == p and pos <= held.n_tokens:
            # the cache holds prompt + prefix, and the parent's hidden state at pos predicts token pos
            cache = cropped_copy(held.caches[side], p + pos)
            states[side] = ModelState.resumed(pair, side, cache, hidden[: pos + 1], pos)
        elif hidden is not None and held.prompt_len[side] == p and pos == held.n_tokens + 1:
            # the parent's last token was never fed: read it (one token per model)
            cache = cropped_copy(held.caches[side], p + pos - 1)
            states[side] = ModelState.resumed(pair, side, cache, hidden, pos, last_token=prefix_ids[-1])
        else:
            # one prefill of prompt + prefix, keeping the hidden states of the prefix for later branches
            state = ModelState(pair, side, [row.prompt_ids[side] + prefix_ids], record=pos + 1)
            state.fed = pos
            states[side] = state
    return states
