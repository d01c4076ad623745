"""The one child-trace kernel: every child of a trace (a switch, a branch, a fan of samples, the continuations of
the effects, the ablations and the success curve) is decoded by `decode_children`.

A child keeps the parent's tokens before its first switch (and their metrics), applies each switch at its
position of the new continuation, and lets `then` decide elsewhere (`THEN`: the parent's policy, the base, the
reasoner), under the parent's sampling settings unless told otherwise (draws keyed by position, so the same
switches and seed give the same text). Every child of one call is one engine batch from the smallest first
position; the model states come from the parent's held caches when they are there (no forward before the first
new token), else from one prefill of prompt + prefix. `store=` keeps each new child, after `on_trace` (e.g. a
grade) has seen it, so it is written once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
from core.decoding.sampling import Sampling, sample_seeds
from core.decoding.state import ModelState
from core.errors import InvalidInputError, PairMismatchError
from core.pair.loading import SIDES, ModelPair
from core.record.assembly import assemble
from core.record.typed import typed_runs
from core.scoring.registry import score_values
from core.settings import Progress
from core.trace import Trace

WHO = ("reason", "base")  # who writes at a switched position (besides given token ids or typed text)
THEN = ("policy", "base", "reason")  # who decides every other position of the new continuation
FAN_TEMPERATURE = float(settings.PRESETS["paper"]["temperature"])  # a greedy trace's fan is sampled at this
Switch = int | str  # at one position: "reason", "base" or a given token id


@dataclass
class SwitchPolicy(Policy):
    """At each switched position the reasoner (`"reason"`), the base (`"base"`) or a given token writes; at every
    other position `then` decides (the parent's policy, BaseOnly or ReasonOnly). `at` is what a child records;
    `rows` (one switch set per row of a batch) replaces it in a batch of children."""

    then: Policy = field(default_factory=BaseOnly)
    at: dict[int, Switch] = field(default_factory=dict)  # position -> "reason" | "base" | token id
    rows: list[dict[int, Switch]] | None = None
    name = "switch"

    def __post_init__(self) -> None:
        self.score = self.then.score
        self.lazy = self.then.lazy  # type: ignore[misc]
        self.reads_base_state = self.then.reads_base_state  # type: ignore[misc]

    @property
    def ats(self) -> list[dict[int, Switch]]:
        return self.rows if self.rows is not None else [self.at]

    def record(self) -> dict[str, Any]:
        return {**self.then.record(), "switches": {str(p): w for p, w in sorted(self.at.items())}}

    def takeover(self, step: Step) -> np.ndarray:
        fire = np.array(self.then.takeover(step), dtype=bool)  # the shared policy once for all rows
        if fire.ndim == 0:
            fire = np.full(len(self.ats), bool(fire))
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


SwitchRows = SwitchPolicy  # its batch form was a class of its own before


def switches(at: dict[Any, Any], vocab_size: int, encode: Callable[[str], list[int]] | None = None) -> dict[int, Switch]:
    """`{pos: "reason" | "base" | id | [ids] | text}` checked and flattened: a list of ids (or typed text, encoded
    by `encode`: the base tokenizer, no special tokens) is forced from its position on."""
    return typed_switches(at, vocab_size, encode)[0]


def typed_switches(at: dict[Any, Any], vocab_size: int, encode: Callable[[str], list[int]] | None = None
                   ) -> tuple[dict[int, Switch], dict[int, int]]:
    """`switches`, and which of them are typed: `{start: n_tokens}` for each text or list of ids (a lone id is
    a forced token, not typed; core.record.typed)."""
    if not isinstance(at, dict) or not at:
        raise InvalidInputError(f"at= maps response positions to 'reason', 'base', a token id, a list of ids or "
                                f"typed text; got {at!r}")
    flat: dict[int, Switch] = {}
    typed: dict[int, int] = {}
    for pos, what in sorted(at.items(), key=lambda kv: int(kv[0]) if str(kv[0]).lstrip("-").isdigit() else -1):
        if isinstance(pos, str) and pos.isdigit():
            pos = int(pos)
        if not isinstance(pos, (int, np.integer)) or isinstance(pos, bool) or pos < 0:
            raise InvalidInputError(f"Switch positions are non-negative ints, got {pos!r}")
        if isinstance(what, str) and what not in WHO:
            if encode is None:
                raise InvalidInputError(f"Position {pos} takes 'reason', 'base', a token id or a list of ids; "
                                        f"got {what!r}")
            what = list(encode(what))
            if not what:
                raise InvalidInputError(f"The typed text at position {pos} is empty (it has no tokens)")
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
                raise InvalidInputError(f"Position {pos + i} takes 'reason', 'base', a token id, a list of ids or "
                                        f"typed text; got {one!r}")
            flat[int(pos) + i] = one
        if isinstance(what, (list, tuple)) and all(isinstance(flat[int(pos) + i], int) for i in range(len(ids))):
            typed[int(pos)] = len(ids)
    return flat, typed


def resolve_then(trace: Trace, then: str | Policy) -> Policy:
    """The policy that decides a child's unswitched positions: a Policy as given, or by name (`THEN`):
    "policy" (the parent's own, rebuilt from its record; BaseOnly when it has none), "base", "reason"."""
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


def check_child(pair: ModelPair, trace: Trace, first: int, *, inside: bool = False) -> None:
    """A child of `trace` can be made with `pair` from position `first`: a token's position, or len(trace) to
    continue a response that was cut short (one that ended with an end-of-sequence token has nothing after it)."""
    if (trace.meta.get("request") or {}).get("pair") not in (None, pair.fingerprint()):
        raise PairMismatchError("This trace was made with a different model pair or prompt formats; "
                                "load the pair it records in meta['pair'] to switch its takeovers")
    ended = len(trace) > 0 and int(trace.token_ids[-1]) in pair.eos_ids
    last = len(trace) - 1 if inside or ended else len(trace)
    if not isinstance(first, (int, np.integer)) or isinstance(first, bool) or not 0 <= first <= last:
        why = (f": the response ended with an end-of-sequence token at {last}, nothing follows it (a switch at {last} "
               "replaces the end)" if ended and first == len(trace) else "")
        raise InvalidInputError(f"Switch position {first!r} is outside the trace (0..{last}){why}")


def child_sampling(trace: Trace, *, max_new_tokens: int | None = None, temperature: float | None = None,
                   seed: int | None = None, pos: int | None = None) -> Sampling:
    """The parent's sampling settings, with a temperature, seed or longer limit if asked (a switch at `pos`
    must lie before the limit)."""
    parent = trace.meta.get("sampling") or {}
    if temperature is not None and not temperature >= 0:
        raise InvalidInputError(f"temperature must be ≥ 0, got {temperature!r}")
    sampling = Sampling(
        temperature=parent.get("temperature", settings.TEMPERATURE) if temperature is None else float(temperature),
        top_p=parent.get("top_p", settings.TOP_P), seed=parent.get("seed", settings.SEED) if seed is None else int(seed),
        max_new_tokens=max_new_tokens or parent.get("max_new_tokens") or len(trace) + settings.MAX_NEW_TOKENS,
        stop=tuple(parent.get("stop", ())),
    )
    if pos is not None and pos >= sampling.max_new_tokens:
        raise InvalidInputError(f"Switch position {pos} is at or past max_new_tokens={sampling.max_new_tokens}")
    return sampling


def fan_temperature(trace: Trace, temperature: float | None) -> float:
    """The temperature of sampled children: `temperature`, or the trace's own when it sampled, else
    FAN_TEMPERATURE (a greedy trace's samples would all be one)."""
    if temperature is None:
        own = float((trace.meta.get("sampling") or {}).get("temperature") or 0.0)
        return own if own > 0 else FAN_TEMPERATURE
    if not temperature >= 0:
        raise InvalidInputError(f"temperature must be ≥ 0, got {temperature!r}")
    return float(temperature)


def _lineage(trace: Trace, first: int) -> tuple[str | None, dict[int, Switch]]:
    """The root this trace was switched from, and its switches that lie before `first` (still in force)."""
    inherited = {int(p): w for p, w in (trace.meta.get("switches") or {}).items() if int(p) < first}
    return trace.meta.get("root") or trace.key, inherited


def _typed_in_force(trace: Trace, in_force: dict[int, Switch], typed: dict[int, int]) -> dict[str, int]:
    """A child's `meta["typed"]` (core.record.typed): the new typed runs, and of each of the parent's the part
    from its start that the child keeps unchanged (a run cut by a new switch keeps the tokens before the cut)."""
    mine = {int(p): w for p, w in (trace.meta.get("switches") or {}).items()}
    new = {q for p, n in typed.items() for q in range(p, p + n)}
    runs: dict[int, int] = {}
    for start, n in [*typed_runs(trace).items(), *typed.items()]:
        fresh = start in typed
        kept = 0
        for q in range(start, start + n):
            if not isinstance(in_force.get(q), int) or (not fresh and (q in new or in_force[q] != mine.get(q))):
                break
            kept += 1
        if kept:
            runs[start] = kept
    return {str(p): n for p, n in sorted(runs.items())}


@dataclass
class Child:
    """One child to decode: its row (request key, meta, seed), the switches it follows (`at`, positions of the
    response) and the first position it writes anew (its tokens before are the parent's)."""

    row: Row
    at: dict[int, Switch]
    first: int


def decode_children(pair: ModelPair, trace: Trace, children: Sequence[Child], then: Policy, sampling: Sampling, *,
                    store: Any = None, on_trace: Callable[[Trace], Any] | None = None, no_op: bool = False,
                    hold_caches: bool = True, lookahead: int | None = None, progress: Progress | None = None,
                    should_stop: Callable[[], bool] | None = None,
                    on_token: Callable[[int, int, str], None] | None = None) -> list[Trace | None]:
    """THE child-trace kernel: the children of `trace` (one `then`, one sampling, per-row seeds) decoded in one
    engine batch from the smallest first position; a row replays the parent's tokens until its own first
    position (one read of the shared prefix).

    A child whose key `store` holds is read back (None where the store cannot give it); a key asked twice is
    decoded once. Each new child goes through `on_trace` (its return value replaces it when it is a Trace),
    then into `store`. With `no_op`, a child whose tokens are the parent's is the parent itself (nothing
    stored): decided without decoding where greedy decoding makes it certain (`_same_as_parent`), else after.
    `hold_caches` keeps a lone child's model states for its own children."""
    out: list[Trace | None] = [None] * len(children)
    todo: dict[str, list[int]] = {}  # store key -> the rows asking for it
    for i, c in enumerate(children):
        key = c.row.meta["key"]
        if no_op and _same_as_parent(trace, c, then, sampling):
            out[i] = trace
        elif store is not None and key in store:
            got = store.get(key)
            out[i] = trace if no_op and got is not None and _same_tokens(got, trace) else got
        else:
            todo.setdefault(key, []).append(i)
    if not todo:
        return out
    batch = [children[rows[0]] for rows in todo.values()]
    if any(c.row.prompt_ids != trace.prompt_ids for c in batch):
        raise PairMismatchError("The pair formats this problem differently from the trace's recorded prompt")
    start = min(c.first for c in batch)
    parent_sources = [str(x) for x in trace.source]
    # the gate's running mean looks back over the shared prefix, exactly as if the child had written it
    gate_values = np.asarray(trace.metrics["entropy_base"] if then.lazy else score_values(trace.metrics, then.score))
    for c in batch:
        c.row.tokens, c.row.source = [int(x) for x in trace.token_ids[:c.first]], parent_sources[:c.first]
        c.row.history = [float(x) for x in gate_values[:c.first]]
    states = resume(pair, trace, batch[0].row, [int(x) for x in trace.token_ids[:start]])
    if len(batch) > 1:
        for state in states.values():
            state.repeat(len(batch))
    policy = SwitchPolicy(then, batch[0].at, rows=[c.at for c in batch])
    t0 = time.perf_counter()
    decoder = Decoder(pair, [c.row for c in batch], policy, sampling, trace.k or settings.K, lookahead=lookahead,
                      states=states, start=start, progress=progress, should_stop=should_stop, on_token=on_token)
    arrays = decoder.run()
    timings = {"generate_s": round(time.perf_counter() - t0, 4), "batch": len(batch)}
    for c, rows, asking in zip(batch, arrays, todo.values()):
        c.row.meta["timings"] = dict(timings)
        if no_op and c.row.tokens == [int(x) for x in trace.token_ids]:
            child: Trace = trace  # the switch changed no token: the parent itself
        else:
            # only the new rows: the prefix's rows (metrics, top-k, display strings) are the parent's, so
            # assembling the child costs the same at any switch position
            new = {name: v[c.first - start:] for name, v in rows.items()}
            child = assemble(pair, c.row.tokens, c.row.prompt_ids, new, c.row.source, c.row.meta, parent=trace,
                             keep=c.first)
            if hold_caches and len(batch) == 1:
                hold(child, decoder.states)
            if on_trace is not None:
                seen = on_trace(child)
                child = seen if isinstance(seen, Trace) else child
            if store is not None:
                store.put(child)
        for i in asking:
            out[i] = child
    return out


def _same_tokens(a: Trace, b: Trace) -> bool:
    return len(a) == len(b) and np.array_equal(np.asarray(a.token_ids), np.asarray(b.token_ids))


def _same_as_parent(trace: Trace, child: Child, then: Policy, sampling: Sampling) -> bool:
    """Whether greedy decoding certainly gives `child` the parent's tokens, without decoding it: both greedy
    under the same limits and the same `then` (not capped by a takeover count, which a changed source moves),
    the parent's switches from `first` on all kept, and at every position where the child's switch is new the
    token it writes is the parent's (the reasoner's or the base's top-1 there, or the given id)."""
    mine = trace.meta.get("sampling") or {}
    if (trace.meta.get("kind") not in ("generate", "branch") or sampling.temperature != 0
            or mine.get("temperature") != 0 or mine.get("max_new_tokens") != sampling.max_new_tokens
            or tuple(mine.get("stop", ())) != sampling.stop or child.first >= len(trace)):
        return False
    if getattr(then, "budget", None) is not None or getattr(then, "max_takeovers", None) is not None:
        return False
    if then.record() != (trace.meta.get("then") or trace.meta.get("policy")):
        return False
    parent_at = {int(p): w for p, w in (trace.meta.get("switches") or {}).items() if int(p) >= child.first}
    if any(child.at.get(p) != w for p, w in parent_at.items()):
        return False  # a parent's switch undone: its policy decides there again (unknown without decoding)
    for p, w in child.at.items():
        if p < child.first or parent_at.get(p) == w:
            continue
        if p >= len(trace):
            return False
        token = w if isinstance(w, int) else int(trace.topk["reason" if w == REASON else "base"][0][p, 0])
        if token != int(trace.token_ids[p]):
            return False
    return True


def _child(pair: ModelPair, trace: Trace, first: int, at: dict[int, Switch], then: Policy,
           sampling: Sampling, typed: dict[int, int] | None = None) -> Child:
    """The child with `trace`'s switches before `first` and `at` (all at or after `first`) in force: its row
    (store key and meta, in the lineage's terms) decoded under `sampling`. `typed`: the runs of `at` that are
    typed text (`typed_switches`); the parent's typed runs that stay in force stay typed."""
    root, inherited = _lineage(trace, first)
    in_force = {**inherited, **at}
    plan = SwitchPolicy(then, in_force)
    parent_sources = [str(s) for s in trace.source]
    record = [{"pos": p, "to": "forced" if isinstance(w, int) else w, "token": w if isinstance(w, int) else None,
               "from": parent_sources[p] if p < len(parent_sources) else None} for p, w in sorted(at.items())]
    extra = {"root": root, "switches": {str(p): w for p, w in sorted(in_force.items())},
             "then": then.record()}  # the policy itself, so then="policy" and that policy give one key
    k = trace.k or settings.K
    row = make_rows(pair, [trace.meta.get("problem") or {"prompt": ""}], 1, plan, sampling, k, kind="branch",
                    extra_request=extra, first_sample=int((trace.meta.get("sampling") or {}).get("sample", 0)))[0]
    row.meta.update(parent=trace.key, root=root, branch_pos=int(first), policy=plan.record(),
                    switches={str(p): w for p, w in sorted(in_force.items())}, switched=record,
                    then=extra["then"], typed=_typed_in_force(trace, in_force, typed or {}))
    if trace.meta.get("calibration"):  # the lineage's gate: how it was calibrated travels with its children
        row.meta["calibration"] = trace.meta["calibration"]
    return Child(row, in_force, int(first))


def takeover(pair: ModelPair, trace: Trace, at: dict[Any, Any], *, then: str | Policy = "policy",
             samples: int | None = None, temperature: float | None = None, seed: int | None = None,
             max_new_tokens: int | None = None, store: Any = None, on_trace: Callable[[Trace], Any] | None = None,
             on_token: Callable[[int, int, str], None] | None = None, lookahead: int | None = None,
             progress: Progress | None = None, should_stop: Callable[[], bool] | None = None) -> Trace | list[Trace]:
    """A child of `trace` with takeovers switched: `at` maps response positions to who writes there ("reason",
    "base"), or to given tokens: an id, a list of ids, or typed text (any other string, encoded with the base
    tokenizer without special tokens), forced from that position on (source "forced", never a takeover).

    Tokens before the smallest position are the parent's (its held caches are reused: no re-read of the
    prefix); from there the response is generated again, each switch applied at its position of the new
    continuation and `then` deciding everywhere else ("policy": the parent's own policy, "base", "reason").
    The child records its parent, its lineage root and every switch in force, so the same switches from any
    ancestor give the same store key. A switch that changes no token gives the parent itself (same key,
    nothing stored). `samples=n` gives a list of n sampled children (one batch; row i is the single call with
    `seed=sample_seeds(seed or the parent's, first, n)[i]`, so a sample that draws the parent's tokens is the
    parent; it records `meta["fan"] = {"sample": i}`, outside the key), at `temperature` (default
    `fan_temperature`).
    `on_trace` sees each new child before it goes into `store`; `on_token(pos, token_id, source)` each new
    token as it is decided (streaming).
    """
    at, typed = typed_switches(at, pair.vocab_size, pair.encode)
    first = min(at)
    check_child(pair, trace, first)
    plan = resolve_then(trace, then)
    if samples is None:
        sampling = child_sampling(trace, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, pos=first)
        child = _child(pair, trace, first, at, plan, sampling, typed)
        return decode_children(pair, trace, [child], plan, sampling, store=store, on_trace=on_trace, no_op=True,
                               lookahead=lookahead, progress=progress, should_stop=should_stop, on_token=on_token)[0]
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 1:
        raise InvalidInputError(f"samples must be an integer ≥ 1, got {samples!r}")
    temp = fan_temperature(trace, temperature)
    base_seed = child_sampling(trace, seed=seed).seed
    kids, sampling = [], None
    for i, s in enumerate(sample_seeds(base_seed, first, int(samples))):
        sampling = child_sampling(trace, max_new_tokens=max_new_tokens, temperature=temp, seed=s, pos=first)
        kids.append(_child(pair, trace, first, at, plan, sampling, typed))
        kids[-1].row.meta["fan"] = {"sample": i}  # which draw (its seed's index), outside the key: a label
    return decode_children(pair, trace, kids, plan, sampling, store=store, on_trace=on_trace,  # type: ignore[return-value]
                           no_op=True, lookahead=lookahead, progress=progress, should_stop=should_stop)


def switches_in_force(trace: Trace) -> dict[int, Switch]:
    """The switches a trace was made with, relative to its lineage root ({} for a root)."""
    return {int(p): w for p, w in (trace.meta.get("switches") or {}).items()}


def flipped(trace: Trace, pos: int) -> dict[int, Switch]:
    """The switches after a click on token `pos`: a switched position loses its switch (its policy decides
    again); any other flips side: a base token becomes a reasoner takeover, a takeover the base's choice."""
    wanted = switches_in_force(trace)
    if pos in wanted:
        del wanted[pos]
    else:
        wanted[pos] = "base" if str(trace.source[pos]) != "base" else REASON
    return wanted


def set_switches(pair: ModelPair, trace: Trace, wanted: dict[int, Any], *, store: Any = None,
                 root: Trace | None = None, then: str | Policy = "policy", max_new_tokens: int | None = None,
                 on_trace: Callable[[Trace], Any] | None = None, on_token: Callable[[int, int, str], None] | None = None,
                 progress: Progress | None = None, should_stop: Callable[[], bool] | None = None) -> Trace:
    """The trace of `trace`'s lineage with exactly the switches `wanted` in force (the switchboard's one call).

    Regenerates from the first position where `wanted` and the trace's own switches differ, reusing the
    trace's prefix (a removed switch lets the policy decide there again); it returns the lineage root
    (`root` when given, else from `store`) when every switch is undone, and `trace` itself when the new
    switches change no token. `on_trace` sees a new child before it goes into `store`.
    """
    return set_switches_many(pair, trace, [wanted], store=store, root=root, then=then, max_new_tokens=max_new_tokens,
                             on_trace=on_trace, on_token=on_token, progress=progress, should_stop=should_stop)[0]


def set_switches_many(pair: ModelPair, trace: Trace, wanted: list[dict[int, Any]], *, store: Any = None,
                      root: Trace | None = None, then: str | Policy = "policy", max_new_tokens: int | None = None,
                      on_trace: Callable[[Trace], Any] | None = None,
                      on_token: Callable[[int, int, str], None] | None = None, progress: Progress | None = None,
                      should_stop: Callable[[], bool] | None = None) -> list[Trace]:
    """`set_switches` for each switch set in `wanted`, the new children decoded together in one batch (the
    same traces and store keys as one call each; stored ones are read back). `on_token` streams a lone one."""
    plan: Policy | None = None
    current = switches_in_force(trace)
    out: list[Trace | None] = [None] * len(wanted)
    todo: list[tuple[int, Child]] = []
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
        plan = plan or resolve_then(trace, then)
        check_child(pair, trace, first)
        sampling = child_sampling(trace, max_new_tokens=max_new_tokens, pos=first)
        at, typed = typed_switches(later, pair.vocab_size, pair.encode) if later else ({}, {})
        todo.append((i, _child(pair, trace, first, at, plan, sampling, typed)))
    if todo:
        made = decode_children(pair, trace, [c for _, c in todo], plan, sampling, store=store,  # type: ignore[arg-type]
                               on_trace=on_trace, no_op=True, progress=progress, should_stop=should_stop,
                               on_token=on_token)
        for (i, _), child in zip(todo, made):
            out[i] = child
    return out  # type: ignore[return-value]


def branch(pair: ModelPair, trace: Trace, pos: int, token: int | None = None, policy: Policy | None = None, *,
           max_new_tokens: int | None = None, lookahead: int | None = None, store: Any = None,
           progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
           temperature: float | None = None, seed: int | None = None,
           on_trace: Callable[[Trace], Any] | None = None) -> Trace:
    """The one-switch `takeover`: keep `trace`'s first `pos` tokens, emit at `pos` the reasoner's choice (or
    `token`), continue with `policy` (BaseOnly by default) under the parent's sampling settings; a branch that
    changes no token is the parent itself."""
    if not isinstance(pos, (int, np.integer)) or isinstance(pos, bool) or not 0 <= pos <= len(trace):
        raise InvalidInputError(f"Branch position {pos!r} is outside the trace (0..{len(trace)})")
    return takeover(pair, trace, {int(pos): REASON if token is None else token},  # type: ignore[return-value]
                    then=policy or BaseOnly(), max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                    store=store, on_trace=on_trace, lookahead=lookahead, progress=progress, should_stop=should_stop)


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
