"""Calibrating the Guided gate: one path, keyed by the pair's fingerprint.

The gate (tau, lam, window) is fit on BaseOnly rollouts of *this* pair: made for the given prompts
(stored ones reused, by request key, which includes the fingerprint), or, without prompts, read from
the store's existing rollouts whose recorded fingerprint is this pair's. Rollouts of another pair are
never used. Rollouts made for a calibration go to the store's calibration store (`rollout_store`), apart
from the user's own traces: a Guided run's calibration adds nothing to what the app lists and analyses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import math

import numpy as np

from core import settings
from core.annotate.spikes import Gate, calibrate_gate, gate_positions
from core.decoding.generation import generate_many
from core.decoding.router_features import trace_features
from core.decoding.policies import (
    BaseOnly,
    EarlyOnly,
    Guided,
    Policy,
    RandomPositions,
    explicit_gate,
    list_policies,
    make_policy,
    policy_spec,
)
from core.errors import InvalidInputError
from core.pair.loading import ModelPair
from core.scoring.registry import check_score, score_values
from core.record.problems import problem_record
from core.settings import Progress
from core.trace import Trace

ROLLOUT_LIMIT = 256  # most stored rollouts read when calibrating from the store alone


def _candidate_keys(store: Any) -> list[str]:
    """Keys of stored BaseOnly `generate` traces (any pair), newest first when the store knows."""
    df = store.summaries()
    if df.empty:
        return []
    rows = df[(df["policy"] == BaseOnly.name) & (df["kind"] == "generate")]
    if "created" in rows:
        rows = rows.sort_values("created", ascending=False, kind="stable")
    return [str(k) for k in rows["key"]]


def _is_this_pair(trace: Trace, pair: ModelPair) -> bool:
    return (trace.meta.get("request") or {}).get("pair") == pair.fingerprint()


def rollout_store(store: Any) -> Any:
    """Where a calibration makes (and next time reuses) its base rollouts: a TraceStore's calibration store,
    kept apart from the user's traces; any other store, or None, as it is."""
    side = getattr(store, "calibration_store", None)
    return side() if callable(side) else store


def base_rollouts(pair: ModelPair, store: Any, limit: int | None = None) -> list[Trace]:
    """The store's BaseOnly rollouts made with this pair (models and prompt formats), at most `limit`: the
    calibrations' own first, then the user's BaseOnly runs (and the rollouts of stores from before the
    calibration store)."""
    if store is None:
        return []
    out, own, seen = [], rollout_store(store), set()
    for where in (own, store) if own is not store else (store,):
        for key in _candidate_keys(where):
            if key in seen:  # an older store's rollout made again in the calibration store: counted once
                continue
            seen.add(key)
            trace = where.get(key)
            if _is_this_pair(trace, pair):
                out.append(trace)
                if limit is not None and len(out) >= limit:
                    return out
    return out


def has_base_rollouts(pair: ModelPair, store: Any) -> bool:
    """Whether the store holds any BaseOnly rollout of this pair (what calibrating from the store needs)."""
    return bool(base_rollouts(pair, store, limit=1))


def calibrate(pair: ModelPair, prompts: Sequence[Any] | None = None, ratio: float = settings.RATIO, *,
              window: int = settings.WINDOW, score: str = settings.SCORE,
              max_new_tokens: int = settings.MAX_NEW_TOKENS, temperature: float = settings.TEMPERATURE,
              top_p: float = settings.TOP_P, seed: int = settings.SEED, batch_size: int = settings.BATCH_SIZE,
              store: Any = None,
              progress: Progress | None = None, limit: int = ROLLOUT_LIMIT,
              executor: Any = None) -> Gate:
    """Fit the Guided gate (tau, lam, window) on this pair's base rollouts, by the paper's rule:
    tau = (1 - r) quantile of the scores, lam = E[s | s > tau] / E[s] (docs/REPRODUCE.md).

    With `prompts`: rollouts of those prompts (stored ones reused; made by `executor` when given, e.g. on
    Ray workers; the gate is always fit here). Without: the store's rollouts of this pair (at most
    `limit`); none there raises InvalidInputError saying how to make them.
    """
    check_score(score)
    if prompts is not None:
        if not len(prompts):
            raise InvalidInputError("calibrate needs at least one prompt")
        traces = generate_many(pair, list(prompts), BaseOnly(), batch_size=batch_size, max_new_tokens=max_new_tokens,
                               temperature=temperature, top_p=top_p, seed=seed, store=rollout_store(store),
                               progress=progress, executor=executor)
    else:
        traces = base_rollouts(pair, store, limit=limit)
        if not traces:
            raise InvalidInputError(
                "No base rollouts of this model pair in the store to calibrate the gate on; make some by "
                "passing problems (core.calibrate(pair, problems, store=store)) or running BaseOnly on them")
    return calibrate_gate([score_values(t.metrics, score) for t in traces], ratio, window)


RHO_DIGITS = 6  # significant digits of an equal-ρ knob: the same rollouts give the same request key


def _eligible(signals: Sequence[np.ndarray], skip_first: int) -> tuple[np.ndarray, int]:
    """(the pooled signal values where the gate may fire, the number of tokens in all)."""
    parts = [np.asarray(s, dtype=np.float64).reshape(-1)[skip_first:] for s in signals]
    pooled = np.concatenate(parts) if parts else np.zeros(0)
    return pooled[~np.isnan(pooled)], sum(int(np.size(s)) for s in signals)


def gate_signal(policy: Policy, trace: Trace, pair: ModelPair | None = None) -> np.ndarray:
    """(T,) the value `policy`'s gate compares with its knob along `trace` (the router's: its probability of the
    base's features there, which needs `pair`)."""
    if policy.reads_base_state:
        if pair is None:
            raise InvalidInputError(f"{policy.label}'s signal along a trace needs the pair (a forward of its base)")
        policy.check_pair(pair)
        return policy.prob(trace_features(pair, trace))  # type: ignore[attr-defined]
    return policy.signal(trace, pair)


def rollout_rho(policy: Policy, rollouts: Sequence[Trace], pair: ModelPair | None = None) -> float:
    """The share of the tokens of `rollouts` (base rollouts) where `policy`'s gate fires, replayed on the base's
    own path (no takeover changes it): what equal-ρ calibration aims at. NaN without tokens."""
    n_tokens = sum(len(t) for t in rollouts)
    if not n_tokens:
        return float("nan")
    if isinstance(policy, RandomPositions):
        return float(policy.rate)
    if isinstance(policy, EarlyOnly):  # the rollouts' max_new_tokens (else the longest); a dithered prefix at its mean
        limit = max(int((t.meta.get("sampling") or {}).get("max_new_tokens") or len(t)) for t in rollouts)
        n = policy.rate * limit if policy.seed is not None else math.ceil(policy.rate * limit - 1e-9)
        return sum(min(len(t), n) for t in rollouts) / n_tokens
    skip = int(getattr(policy, "skip_first", 0))
    fired = 0
    for t in rollouts:
        s = gate_signal(policy, t, pair)
        if isinstance(policy, Guided):
            fired += int(np.sum(gate_positions(s, policy.gate) >= skip))
        else:
            knob = getattr(policy, str(policy.knob))
            hit = (s < knob) if policy.fires_below else (s > knob)
            fired += int(np.sum(hit[skip:]))
    return fired / n_tokens


def equal_rho(name: str, rollouts: Sequence[Trace], rho: float, *, params: dict[str, Any] | None = None,
              pair: ModelPair | None = None, max_new_tokens: int | None = None) -> dict[str, Any]:
    """The parameters of gate `name` (its other `params` kept) with its one knob set so that it would take over
    a share `rho` of the tokens of `rollouts` (base rollouts, see `rollout_rho`): Guided's τ/λ refit by the
    paper's rule at the ratio r whose gate fires at that share (bisection on r); the thresholds of the gates on
    the base alone (entropy, top-1 probability, margin, the router's cut) as quantiles of their signal; random
    positions' rate; early-only's prefix sized on the rollouts' mean length. The one equal-ρ calibration:
    `build_policy(rho=...)` (CLI, app) and `compare_gates` come here."""
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not 0.0 < float(rho) < 1.0:
        raise InvalidInputError(f"rho (the target takeover rate) must be in (0, 1), got {rho!r}")
    spec = policy_spec(name)
    cls = spec.cls
    if cls.knob is None:
        raise InvalidInputError(f"Policy {name!r} has no knob to calibrate; the gates that do: "
                                f"{', '.join(s.name for s in list_policies() if s.cls.knob)}")
    if not rollouts or not sum(len(t) for t in rollouts):
        raise InvalidInputError("equal-ρ calibration needs base rollouts with at least one token")
    params = {k: v for k, v in dict(params or {}).items() if k not in ("tau", "lam", cls.knob)}
    rho = float(rho)
    if cls is RandomPositions:
        return {**params, "rate": rho}
    if cls is EarlyOnly:  # a dithered prefix: its mean is rho · the rollouts' mean length, not a whole token
        mean = float(np.mean([len(t) for t in rollouts]))
        limit = int(max_new_tokens or max(len(t) for t in rollouts))
        return {**params, "rate": min(1.0, rho * mean / limit), "seed": int(params.get("seed", settings.SEED))}
    if cls is Guided:
        return {**params, **_guided_at_rho(rollouts, rho, params)}
    probe = make_policy(name, **params)
    values, n_tokens = _eligible([gate_signal(probe, t, pair) for t in rollouts], int(params.get("skip_first", 0)))
    if not values.size:
        raise InvalidInputError(f"no signal values to calibrate {spec.label} on (every position skipped)")
    share = min(1.0, rho * n_tokens / values.size)  # of the positions where it may fire
    knob = float(np.quantile(values, share if cls.fires_below else 1.0 - share))
    knob = float(f"{knob:.{RHO_DIGITS}g}")
    declared = spec.param(cls.knob)
    if declared.low is not None:
        knob = max(float(declared.low), knob)
    if declared.high is not None:
        knob = min(float(declared.high), knob)
    return {**params, cls.knob: knob}


def _guided_at_rho(rollouts: Sequence[Trace], rho: float, params: dict[str, Any]) -> dict[str, Any]:
    """Guided's tau/lam/window: the paper's rule at the calibration ratio r whose gate fires at a share `rho` of
    the rollouts' tokens (its λ test makes that share smaller than r; it grows with r)."""
    window = int(params.get("window", settings.WINDOW))
    probe = make_policy("guided", tau=0.0, lam=1.0, window=window, score=params.get("score", settings.SCORE))
    scores = [probe.signal(t) for t in rollouts]
    skip = int(params.get("skip_first", 0))
    n_tokens = sum(len(s) for s in scores)
    lo, hi = 1e-4, 1.0 - 1e-4
    best: tuple[float, Gate] | None = None
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        try:
            gate = calibrate_gate(scores, mid, window)
        except InvalidInputError:  # no score above the quantile: a larger r
            lo = mid
            continue
        got = sum(int(np.sum(gate_positions(s, gate) >= skip)) for s in scores) / n_tokens
        if best is None or abs(got - rho) < abs(best[0] - rho):
            best = (got, gate)
        lo, hi = (mid, hi) if got < rho else (lo, mid)
        if hi / lo < 1.0 + 1e-4:
            break
    if best is None:
        raise InvalidInputError("the Guided gate could not be fit on these rollouts (constant scores?)")
    return {"tau": best[1].tau, "lam": best[1].lam, "window": best[1].window}


def build_policy(pair: ModelPair | None, name: str, params: dict[str, Any] | None = None, *,
                 calibrate_on: Sequence[Any] = (), ratio: float = settings.RATIO, store: Any = None,
                 max_new_tokens: int = settings.MAX_NEW_TOKENS, temperature: float = settings.TEMPERATURE,
                 top_p: float = settings.TOP_P, seed: int = settings.SEED, batch_size: int = settings.BATCH_SIZE,
                 progress: Progress | None = None, executor: Any = None,
                 rho: float | None = None, rollouts: Sequence[Trace] | None = None) -> Policy:
    """`make_policy(name, **params)`, calibrating the gate first when the policy needs one and `params` give
    no tau: on base rollouts of `calibrate_on` at `ratio`, with the window and score from `params`.
    With `rho` (a target takeover rate): equal-ρ calibration (`equal_rho`) of any gate's knob on the base
    rollouts of `calibrate_on` (or on `rollouts`, made already), replacing the knob in `params`.
    The CLI, the app, the notebook and `compare_gates` build every policy through here."""
    spec = policy_spec(name)
    params = dict(params or {})
    if rho is not None:
        if rollouts is None:
            if pair is None or not len(calibrate_on):
                raise InvalidInputError(f"{spec.label} at a takeover rate rho={rho!r} needs problems whose base "
                                        "rollouts calibrate it")
            rollouts = generate_many(pair, list(calibrate_on), BaseOnly(), batch_size=batch_size,
                                     max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                                     store=rollout_store(store), progress=progress, executor=executor)
        rollouts = list(rollouts)
        policy = make_policy(name, **equal_rho(name, rollouts, rho, params=params, pair=pair,
                                               max_new_tokens=max_new_tokens))
        policy.fit = {"rho": float(rho), "rollouts": len(rollouts)}
        return policy
    if not spec.needs_gate or explicit_gate(params):
        return make_policy(name, **params)
    if pair is None or not len(calibrate_on):
        raise InvalidInputError(f"{spec.label} needs problems to calibrate its gate on (or explicit tau/lam/window)")
    from_gate = {p.name for p in spec.params if p.from_gate}
    window = int(params.get("window", settings.WINDOW))
    gate = calibrate(pair, list(calibrate_on), ratio=ratio, window=window, score=str(params.get("score", settings.SCORE)),
                     max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                     batch_size=batch_size, store=store, progress=progress, executor=executor)
    policy = make_policy(name, gate=gate, **{k: v for k, v in params.items() if k not in from_gate})
    policy.fit = {**(policy.fit or {}), "problems": len(calibrate_on)}
    return policy


def has_thinking_mode(tokenizer: Any) -> bool:
    """Whether a chat model can open a thought: its chat template or vocabulary knows "<think>"."""
    template = getattr(tokenizer, "chat_template", None) or ""
    template = template if isinstance(template, str) else " ".join(map(str, getattr(template, "values", lambda: [])()))
    if "<think>" in template or "enable_thinking" in template:
        return True
    try:
        return "<think>" in tokenizer.get_vocab()
    except (AttributeError, TypeError):
        return False


def first_token_advice(pair: ModelPair) -> str:
    """What to do when t = 0 is the largest spike of most base rollouts, for this pair: `+think` only helps
    a reasoner with a thinking mode whose format does not open its thought already; any other pair (a
    raw base beside a chat model without thinking, or formats that differ otherwise) needs the gates'
    `skip_first` so that the artefact at the start is never taken over."""
    fmt = pair.formats["reason"]
    described = fmt.describe()
    tokenizer = pair.prompt_tokenizers.get("reason", pair.tokenizer)
    skip = ("set the gate's skip_first (CLI: --skip-first 1; reproduce: --skip-first 1) so that the gate never "
            "fires at the format artefact at t = 0")
    if described["kind"] == "chat" and described["prefill"] != "think" and has_thinking_mode(tokenizer):
        return (f"the reasoner's format {fmt.spec!r} does not open its thought: use a +think format (e.g. "
                f"paper-think, or chat:think+think), or {skip}")
    why = ("the reasoner's format already opens its thought" if described["prefill"] == "think" else
           "the reasoner has no thinking mode, so +think would not help" if described["kind"] == "chat" else
           "the reasoner reads a raw prompt (+think applies to chat formats only)")
    return f"{why}; {skip}"


def holdout(pool: Sequence[Any], chosen: Sequence[Any], n: int) -> tuple[list[Any], bool]:
    """Calibration problems for a gate that will run on `chosen`: up to `n` problems of `pool` that are not
    among `chosen` (held out), and False; when `pool` has none left, the first `n` of `chosen` and True
    (in-sample: the caller should say so)."""
    def ident(p: Any) -> tuple[str, str]:
        rec = problem_record(p)
        return str(rec["id"]), rec["prompt"]

    used = {ident(p) for p in chosen}
    rest = [p for p in pool if ident(p) not in used][:n]
    return (rest, False) if rest else (list(chosen)[:n], True)


def first_token_takeover_share(traces: Sequence[Trace]) -> float:
    """Share of the takeovers (tokens the reasoner wrote) in `traces` that are at t = 0 (NaN when there are none)."""
    firsts = sum(int(len(t) > 0 and bool(t.takeovers[0])) for t in traces)
    total = sum(t.n_takeovers for t in traces)
    return firsts / total if total else float("nan")
