"""Switching takeovers on and off: a child trace from switches on a parent (`takeover`; `branch` is one switch).

The child keeps the parent's tokens before the first switch (and their metrics), applies each switch at
its position of the new continuation, and lets `then` decide elsewhere, under the parent's sampling
settings (draws keyed by position, so the same switches give the same text). The model states come from
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
from core.decoding.generation import make_rows
from core.decoding.policies import (
    REASON,
    BaseOnly,
    Policy,
    ReasonOnly,
    Step,
    policy_from_record,
)
from core.decoding.sampling import Sampling
from core.decoding.state import ModelState
from core.errors import InvalidInputError, PairMismatchError
from core.pair.loading import SIDES, ModelPair
from core.scoring.registry import score_values
from core.scoring.teacher_forced import assemble
from core.settings import Progress
from core.trace import Trace

WHO = ("reason", "base")  # who writes at a switched position (besides a given token id or a typed list of ids)
THEN = ("policy", "base", "reason")  # who decides every other position of the new continuation


@dataclass
class SwitchPolicy(Policy):
    """At each switched position: the reasoner (`"reason"`), the base (`"base"`) or a given token; at every
    other position `then` decides (the parent's policy, BaseOnly or ReasonOnly). What a child records."""

    then: Policy = field(default_factory=BaseOnly)
    at: dict[int, int | str] = field(default_factory=dict)  # position -> "reason" | "base" | token id
    name = "switch"

    def __post_init__(self) -> None:
        self.score = self.then.score
        self.lazy = self.then.lazy  # type: ignore[misc]

    def record(self) -> dict[str, Any]:
        return {**self.then.record(), "switches": {str(p): w for p, w in sorted(self.at.items())}}

    def takeover(self, step: Step) -> np.ndarray:
        return SwitchRows(self.then, [self.at]).takeover(step)

    def forced_token(self, t: int) -> int | None:
        return SwitchRows(self.then, [self.at]).forced_token(t)  # type: ignore[return-value]


@dataclass
class SwitchRows(Policy):
    """Row i of a batch follows the switches `ats[i]`; `then` (shared) decides wherever a row has none."""

    then: Policy = field(default_factory=BaseOnly)
    ats: list[dict[int, int | str]] = field(default_factory=list)
    name = "switch"

    def __post_init__(self) -> None:
        self.score = self.then.score
        self.lazy = self.then.lazy  # type: ignore[misc]

    def takeover(self, step: Step) -> np.ndarray:
        fire = np.array(self.then.takeover(step), dtype=bool)  # the shared policy once for all rows
        for i, at in enumerate(self.ats):
            what = at.get(step.t)
            if what is not None:
                fire[i] = what == REASON
        return fire

    def forced_token(self, t: int) -> int | list[int | None] | None:  # type: ignore[override]
        """The token forced at t: one id (or None) for every row, else one per row (the engine takes both)."""
        default = self.then.forced_token(t)
        own = [default if t not in at else at[t] if isinstance(at[t], int) else None for at in self.ats]
        return own[0] if all(o == own[0] for o in own) else own


def switches(at: dict[Any, Any], vocab_size: int) -> dict[int, int | str]:
    """`{pos: "reason" | "base" | id | [ids]}` checked and flattened: a list of ids is forced from its position on."""
    if not isinstance(at, dict) or not at:
        raise InvalidInputError(f"at= maps response positions to 'reason', 'base', a token id or a list of ids; got {at!r}")
    flat: dict[int, int | str] = {}
    for pos, what in sorted(at.items(), key=lambda kv: int(kv[0]) if str(kv[0]).lstrip("-").isdigit() else -1):
        if isinstance(pos, str) and pos.isdigit():
            pos = int(pos)
        if not isinstance(pos, (int, np.integer)) or pos < 0:
            raise InvalidInputError(f"Switch positions are non-negative ints, got {pos!r}")
        ids = what if isinstance(what, (list, tuple)) else [what]
        if not ids:
            raise InvalidInputError(f"The typed token list at position {pos} is empty")
        for i, one in enumerate(ids):
            if isinstance(one, (int, np.integer)) and not isinstance(one, bool):
                if not 0 <= int(one) < vocab_size:
                    raise InvalidInputError(f"Token id {one} at position {pos + i} is outside the vocabulary "
                                            f"(0..{vocab_size - 1})")
                one = int(one)
            elif one not in WHO or len(ids) > 1:
                raise InvalidInputError(f"Position {pos + i} takes 'reason', 'base', a token id or a list of ids; "
                                        f"got {one!r}")
            flat[int(pos) + i] = one
    return flat


def _then(trace: Trace, then: str | Policy) -> Policy:
    if isinstance(then, Policy):
        return then
    if then == "base":
        return BaseOnly()
    if then == "reason":
        return ReasonOnly()
    if then == "policy":
        record = trace.meta.get("policy")
        try:
            return policy_from_record(record) if record else BaseOnly()
        except InvalidInputError as err:
            raise InvalidInputError(f"then='policy' needs the parent's policy, which cannot be rebuilt ({err}); "
                                    "use then='base' or then='reason'") from err
    raise InvalidInputError(f"then must be one of {', '.join(THEN)} or a Policy, got {then!r}")


def _check(pair: ModelPair, trace: Trace, first: int) -> None:
    if (trace.meta.get("request") or {}).get("pair") not in (None, pair.fingerprint()):
        raise PairMismatchError("This trace was made with a different model pair or prompt formats; "
                                "load the pair it records in meta['pair'] to switch its takeovers")
    if not 0 <= first <= len(trace):
        raise InvalidInputError(f"Switch position {first} is outside the trace (0..{len(trace)})")


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
        raise InvalidInputError(f"Switch position {pos} is at or past max_new_tokens={sampling.max_new_tokens}")
    return sampling


def _lineage(trace: Trace, first: int) -> tuple[str | None, dict[int, int | str]]:
    """The root this trace was switched from, and its switches that lie before `first` (still in force)."""
    inherited = {int(p): w for p, w in (trace.meta.get("switches") or {}).items() if int(p) < first}
    return trace.meta.get("root") or trace.key, inherited


def takeover(pair: ModelPair, trace: Trace, at: dict[Any, Any], *, then: str | Policy = "policy",
             max_new_tokens: int | None = None, temperature: float | None = None, seed: int | None = None,
             on_token: Callable[[int, int, str], None] | None = None, store: Any = None,
             lookahead: int | None = None, progress: Progress | None = None,
             should_stop: Callable[[], bool] | None = None) -> Trace:
    """A child of `trace` with takeovers switched: `at` maps response positions to who writes there
    ("reason", "base", a token id, or a list of ids typed from that position on).

    Tokens before the smallest position are the parent's (its held caches are reused: no re-read of
    the prefix); from there the response is generated again, each switch applied at its position of the
    new continuation and `then` deciding everywhere else ("policy": the parent's own policy, "base",
    "reason"). The child records its parent, its lineage root and every switch in force, so the same
    switches from any ancestor give the same store key; `on_token(pos, token_id, source)` sees each
    new token as it is decided (streaming).
    """
    at = switches(at, pair.vocab_size)
    return _regenerate(pair, trace, min(at), at, then, max_new_tokens=max_new_tokens, temperature=temperature,
                       seed=seed, on_token=on_token, store=store, lookahead=lookahead, progress=progress,
                       should_stop=should_stop)


@dataclass
class _Child:
    """One child to decode: its row (request key, meta, the parent's prefix and gate values), its switches
    and the first position it writes anew."""

    row: Row
    plan: SwitchPolicy
    first: int


def _regenerate(pair: ModelPair, trace: Trace, first: int, at: dict[int, int | str], then: str | Policy, *,
                max_new_tokens: int | None, temperature: float | None, seed: int | None,
                on_token: Callable[[int, int, str], None] | None, store: Any, lookahead: int | None,
                progress: Progress | None, should_stop: Callable[[], bool] | None) -> Trace:
    """Keep `trace`'s tokens before `first`, generate the rest with the trace's switches before `first`
    and `at` (all at or after `first`) in force."""
    plan = _then(trace, then)
    child, sampling = _prepare(pair, trace, first, at, plan, max_new_tokens=max_new_tokens,
                               temperature=temperature, seed=seed)
    if store is not None and child.row.meta["key"] in store:
        return store.get(child.row.meta["key"])
    return _decode(pair, trace, [child], sampling, store=store, lookahead=lookahead, progress=progress,
                   should_stop=should_stop, on_token=on_token)[0]


def _prepare(pair: ModelPair, trace: Trace, first: int, at: dict[int, int | str], then: Policy, *,
             max_new_tokens: int | None, temperature: float | None, seed: int | None) -> tuple[_Child, Sampling]:
    """The row of the child with `trace`'s switches before `first` and `at` in force (its store key and
    meta), under the sampling settings it is decoded with."""
    _check(pair, trace, first)
    sampling = _sampling(trace, max_new_tokens, first)
    if temperature is not None or seed is not None:
        if temperature is not None and not temperature >= 0:
            raise InvalidInputError(f"temperature must be ≥ 0, got {temperature!r}")
        sampling = replace(sampling, temperature=sampling.temperature if temperature is None else float(temperature),
                           seed=sampling.seed if seed is None else int(seed))
    root, inherited = _lineage(trace, first)
    in_force = {**inherited, **at}
    plan = SwitchPolicy(then, in_force)
    parent_sources = [str(s) for s in trace.source]
    record = [{"pos": p, "to": "forced" if isinstance(w, int) else w, "token": w if isinstance(w, int) else None,
               "from": parent_sources[p] if p < len(parent_sources) else None} for p, w in sorted(at.items())]
    extra = {"root": root, "switches": {str(p): w for p, w in sorted(in_force.items())},
             "then": plan.then.record()}  # the policy itself, so then="policy" and that policy give one key
    k = trace.k or settings.K
    rows = make_rows(pair, [trace.meta.get("problem") or {"prompt": ""}], 1, plan, sampling, k, kind="branch",
                     extra_request=extra, first_sample=int((trace.meta.get("sampling") or {}).get("sample", 0)))
    row = rows[0]
    row.meta.update(parent=trace.key, root=root, branch_pos=int(first), policy=plan.record(),
                    switches={str(p): w for p, w in sorted(in_force.items())}, switched=record,
                    then=extra["then"])
    row.tokens, row.source = [int(x) for x in trace.token_ids[:first]], parent_sources[:first]
    # the gate's running mean looks back over the shared prefix, exactly as if the child had written it
    gate_values = trace.metrics["entropy_base"] if plan.lazy else score_values(trace.metrics, plan.score)
    row.history = [float(x) for x in np.asarray(gate_values)[:first]]
    return _Child(row, plan, int(first)), sampling


def _decode(pair: ModelPair, trace: Trace, children: list[_Child], sampling: Sampling, *, store: Any,
            lookahead: int | None, progress: Progress | None, should_stop: Callable[[], bool] | None,
            on_token: Callable[[int, int, str], None] | None = None) -> list[Trace]:
    """Decode children of `trace` (one `then`, one sampling) in one batch from the smallest first position:
    a row replays the parent's tokens until its own first position (one read of the shared prefix)."""
    if any(c.row.prompt_ids != trace.prompt_ids for c in children):
        raise PairMismatchError("The pair formats this problem differently from the trace's recorded prompt")
    start = min(c.first for c in children)
    states = resume(pair, trace, children[0].row, [int(x) for x in trace.token_ids[:start]])
    if len(children) > 1:
        for state in states.values():
            state.repeat(len(children))
    policy = SwitchRows(children[0].plan.then, [c.plan.at for c in children])
    t0 = time.perf_counter()
    decoder = Decoder(pair, [c.row for c in children], policy, sampling, trace.k or settings.K, lookahead=lookahead,
                      states=states, start=start, progress=progress, should_stop=should_stop, on_token=on_token)
    arrays = decoder.run()
    timings = {"generate_s": round(time.perf_counter() - t0, 4), "batch": len(children)}
    out = []
    for c, rows in zip(children, arrays):
        c.row.meta["timings"] = dict(timings)
        # only the new rows: the prefix's rows (metrics, top-k, display strings) are the parent's, so
        # assembling the child costs the same at any switch position
        new = {name: v[c.first - start:] for name, v in rows.items()}
        child = assemble(pair, c.row.tokens, c.row.prompt_ids, new, c.row.source, c.row.meta, parent=trace,
                         keep=c.first)
        if len(children) == 1:
            hold(child, decoder.states)
        if store is not None:
            store.put(child)
        out.append(child)
    return out


def switches_in_force(trace: Trace) -> dict[int, int | str]:
    """The switches a trace was made with, relative to its lineage root ({} for a root)."""
    return {int(p): w for p, w in (trace.meta.get("switches") or {}).items()}


def flipped(trace: Trace, pos: int) -> dict[int, int | str]:
    """The switches after a click on token `pos`: a switched position loses its switch (its policy decides
    again); any other flips side: a base token becomes a reasoner takeover, a takeover the base's choice."""
    wanted = switches_in_force(trace)
    if pos in wanted:
        del wanted[pos]
    else:
        wanted[pos] = "base" if str(trace.source[pos]) != "base" else REASON
    return wanted


def set_switches(pair: ModelPair, trace: Trace, wanted: dict[int, int | str], *, store: Any = None,
                 root: Trace | None = None, then: str | Policy = "policy", max_new_tokens: int | None = None,
                 on_token: Callable[[int, int, str], None] | None = None, progress: Progress | None = None,
                 should_stop: Callable[[], bool] | None = None) -> Trace:
    """The trace of `trace`'s lineage with exactly the switches `wanted` in force (the switchboard's one call).

    Regenerates from the first position where `wanted` and the trace's own switches differ, reusing the
    trace's prefix (a removed switch lets the policy decide there again); it returns the lineage root
    (`root` when given, else from `store`) when every switch is undone.
    """
    return set_switches_many(pair, trace, [wanted], store=store, root=root, then=then, max_new_tokens=max_new_tokens,
                             on_token=on_token, progress=progress, should_stop=should_stop)[0]


def set_switches_many(pair: ModelPair, trace: Trace, wanted: list[dict[int, int | str]], *, store: Any = None,
                      root: Trace | None = None, then: str | Policy = "policy", max_new_tokens: int | None = None,
                      on_token: Callable[[int, int, str], None] | None = None, progress: Progress | None = None,
                      should_stop: Callable[[], bool] | None = None) -> list[Trace]:
    """`set_switches` for each switch set in `wanted`, the new children decoded together in one batch (the
    same traces and store keys as one call each; stored ones are read back). `on_token` streams a lone one."""
    plan: Policy | None = None
    current = switches_in_force(trace)
    out: list[Trace | None] = [None] * len(wanted)
    keys: list[str | None] = [None] * len(wanted)
    todo: dict[str, _Child] = {}  # store key -> the child to decode (a switch set asked twice is decoded once)
    sampling = None
    for i, one in enumerate(wanted):
        one = {int(p): w for p, w in one.items()}
        if one == current:
            out[i] = trace
            continue
        first = min(p for p in set(current) | set(one) if current.get(p) != one.get(p))
        root_key = trace.meta.get("root")
        if not one and root is not None and root.key == root_key:
            out[i] = root  # every switch undone: the root itself
            continue
        if not one and store is not None and root_key is not None and root_key in store:
            out[i] = store.get(root_key)
            continue
        later = {p: w for p, w in one.items() if p >= first}
        plan = plan or _then(trace, then)
        child, sampling = _prepare(pair, trace, first, switches(later, pair.vocab_size) if later else {}, plan,
                                   max_new_tokens=max_new_tokens, temperature=None, seed=None)
        keys[i] = key = child.row.meta["key"]
        if store is not None and key in store:
            out[i] = store.get(key)
        else:
            todo.setdefault(key, child)
    if todo:
        made = _decode(pair, trace, list(todo.values()), sampling, store=store, lookahead=None,  # type: ignore[arg-type]
                       progress=progress, should_stop=should_stop, on_token=on_token)
        by_key = dict(zip(todo, made))
        out = [by_key[key] if got is None else got for got, key in zip(out, keys)]  # type: ignore[index]
    return out  # type: ignore[return-value]


def branch(pair: ModelPair, trace: Trace, pos: int, token: int | None = None, policy: Policy | None = None, *,
           max_new_tokens: int | None = None, lookahead: int | None = None, store: Any = None,
           progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
           temperature: float | None = None, seed: int | None = None) -> Trace:
    """The one-switch `takeover`: keep `trace`'s first `pos` tokens, emit at `pos` the reasoner's choice (or
    `token`), continue with `policy` (BaseOnly by default) under the parent's sampling settings."""
    if not isinstance(pos, (int, np.integer)) or isinstance(pos, bool) or not 0 <= pos <= len(trace):
        raise InvalidInputError(f"Branch position {pos!r} is outside the trace (0..{len(trace)})")
    return takeover(pair, trace, {int(pos): REASON if token is None else token}, then=policy or BaseOnly(),
                    max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, store=store,
                    lookahead=lookahead, progress=progress, should_stop=should_stop)


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
