"""Does a takeover matter here? The causal effect of who writes one token.

`takeover_effects`: at each position, `samples` continuations where the reasoner writes the token and
`samples` where the base writes it (then the trace's own policy), graded against the gold answer.
acc_with / acc_without carry 95% Wilson score intervals; effect = acc_with - acc_without carries
Newcombe's hybrid score interval (his method 10, from the two Wilson intervals). Sample i of both arms
uses the same seed (common random numbers): the arms then differ only where the switched token sends
them apart, which narrows the true spread of the difference; the interval, built for independent
arms, is then conservative.

The success curve (P(correct | prefix)) is in `core.instruments.success_curve`.

Every continuation is a child trace (kept in the store when one is given, so a re-run decodes nothing).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from core import settings
from core.annotate.spikes import spikes_or_top
from core.decoding.sampling import sample_seeds
from core.decoding.takeover import FAN_TEMPERATURE, fan_temperature
from core.errors import InvalidInputError
from core.evaluation.grading import gold_of, grade_trace
from core.instruments.continuations import ContinueJob, continue_batch
from core.instruments.intervals import newcombe, spearman, wilson
from core.pair.loading import ModelPair
from core.scoring.registry import check_score, score_values
from core.settings import Progress
from core.trace import Trace

EFFECT_COLUMNS = ["trace", "pos", "token", "base_token", "reason_token", "score", "acc_with", "acc_without",
                  "effect", "ci_low", "ci_high", "n", "with_low", "with_high", "without_low", "without_high",
                  "interval", "keys_with", "keys_without"]
INTERVAL = "wilson95"  # accuracies: Wilson score; effects: Newcombe hybrid score (method 10), both 95%
SAMPLED_TEMPERATURE = FAN_TEMPERATURE  # a greedy trace's effects are sampled at this



def _continue(pair: ModelPair, trace: Trace, pos: int, who: Sequence[str], sample_seed: Sequence[int], *,
              then: str = "policy", temperature: float, store: Any = None, max_new_tokens: int | None = None,
              should_stop: Callable[[], bool] | None = None) -> list[Trace]:
    """Graded children of `trace`, one per row i: its first `pos` tokens, token `pos` written by `who[i]`
    ("reason" / "base"), the rest by `then` ("policy": the trace's own; "base"; "reason"), drawn with
    `sample_seed[i]`. All rows are one batch of the child-trace kernel (`decode_children`, as `core.takeover`):
    row i has the tokens of `takeover(pair, trace, {pos: who[i]}, then=then, seed=sample_seed[i],
    temperature=temperature)` (tests/test_takeover.py checks it), under the continuation's own store key."""
    return continue_batch(pair, trace, pos, who, sample_seed, then=then, temperature=temperature,
                          max_new_tokens=max_new_tokens, store=store, should_stop=should_stop)


def resolve_temperature(trace: Trace, temperature: float | None) -> float:
    """`temperature`, or the trace's own when it sampled, else SAMPLED_TEMPERATURE (a greedy trace's
    samples would all be one): the kernel's `fan_temperature`."""
    return fan_temperature(trace, temperature)


def _check(trace: Trace, samples: int) -> None:
    if gold_of(trace) is None:
        raise InvalidInputError(f"Trace {trace.key} has no gold answer: continuations cannot be graded")
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 1:
        raise InvalidInputError(f"samples must be an integer ≥ 1, got {samples!r}")


def effect_positions(trace: Trace, positions: Sequence[int] | str | None, score: str = settings.SCORE) -> list[int]:
    """The positions to measure: the trace's spikes by `score` (None or "spikes"), or the given ones, sorted."""
    if positions is None or positions == "spikes":
        return sorted(int(p) for p in spikes_or_top(trace, score))
    if isinstance(positions, str):
        raise InvalidInputError(f"positions must be 'spikes' or a list of token positions, got {positions!r}")
    out = sorted({int(p) for p in positions})
    bad = [p for p in out if not 0 <= p < len(trace)]
    if bad:
        raise InvalidInputError(f"Position {bad[0]} is outside the trace (0..{len(trace) - 1})")
    return out


def _correct(traces: list[Trace]) -> int:
    return sum(bool(t.meta.get("correct")) for t in traces)


def takeover_effects(pair: ModelPair, trace: Trace, positions: Sequence[int] | str | None = None, samples: int = settings.EFFECT_SAMPLES, *,
                     temperature: float | None = None, seed: int = settings.SEED, score: str = settings.SCORE, store: Any = None,
                     max_new_tokens: int | None = None, progress: Progress | None = None,
                     should_stop: Callable[[], bool] | None = None, executor: Any = None) -> pd.DataFrame:
    """Per position (default: the trace's spikes), the accuracy with the reasoner writing it and with the
    base writing it (`samples` continuations each, one batch per position), and the effect with its interval.
    With `executor` (a `core.scale` executor), the positions are spread over its workers: see `measure_effects`.

    Columns: trace, pos, token, base_token, reason_token (each model's top choice there), score,
    acc_with, acc_without, effect, ci_low, ci_high (Newcombe 95%), n (continuations per arm), the arms'
    Wilson 95% intervals, interval (the method's name), keys_with / keys_without (space-separated
    continuation keys). Temperature: see `resolve_temperature`; at 0 each arm is one continuation (n = 1).
    """
    if executor is not None:
        return measure_effects(pair, [trace], positions, samples, temperature=temperature, seed=seed, score=score,
                               store=store, max_new_tokens=max_new_tokens, progress=progress,
                               should_stop=should_stop, executor=executor)
    _check(trace, samples)
    check_score(score)
    temp = resolve_temperature(trace, temperature)
    n = samples if temp > 0 else 1
    todo = effect_positions(trace, positions, score)
    values = np.asarray(score_values(trace.metrics, score), dtype=np.float64)
    rows = []
    for done, pos in enumerate(todo):
        seeds = sample_seeds(seed, pos, n)
        kids = _continue(pair, trace, pos, ["reason"] * n + ["base"] * n, seeds + seeds, temperature=temp,
                         store=store, max_new_tokens=max_new_tokens, should_stop=should_stop)
        top = [pair.token_text(int(trace.topk[side][0][pos, 0])) for side in ("base", "reason")]
        rows.append(_effect_row(trace, pos, kids[:n], kids[n:], values[pos], *top))
        if progress is not None:
            progress(done + 1, len(todo))
    return pd.DataFrame(rows, columns=EFFECT_COLUMNS)


def measure_effects(pair: Any, traces: Sequence[Trace], positions: Sequence[int] | str | None = None,
                    samples: int = settings.EFFECT_SAMPLES, *, temperature: float | None = None, seed: int = settings.SEED,
                    score: str = settings.SCORE, store: Any = None, max_new_tokens: int | None = None,
                    progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
                    executor: Any = None) -> pd.DataFrame:
    """`takeover_effects` of every trace, one table in trace order. With `executor` (`core.scale`'s
    InProcessExecutor or RayExecutor) every (trace, position) batch is one `ContinueJob`, all of them spread
    over the workers at once; rows, keys and stored continuations equal the in-process run's (each batch
    decodes the same rows with the same seeds wherever it runs), and `pair` may be a `PairSpec` (only the
    workers load the models). `progress(done, total)` counts positions; `should_stop` is asked between batches."""
    check_score(score)
    plans = []
    for trace in traces:
        _check(trace, samples)
        temp = resolve_temperature(trace, temperature)
        plans.append((trace, effect_positions(trace, positions, score), samples if temp > 0 else 1, temp))
    total = sum(len(todo) for _, todo, _, _ in plans)
    if executor is None:
        frames, done = [], 0
        for trace, todo, _, _ in plans:
            tick = None if progress is None else (lambda d, _t, _done=done: progress(_done + d, total))
            frames.append(takeover_effects(pair, trace, todo, samples, temperature=temperature, seed=seed, score=score,
                                           store=store, max_new_tokens=max_new_tokens, progress=tick,
                                           should_stop=should_stop))
            done += len(todo)
        return _concat(frames)
    jobs, where = [], []
    for trace, todo, n, temp in plans:
        for pos in todo:
            seeds = tuple(sample_seeds(seed, pos, n))
            jobs.append(ContinueJob(trace, pos, ("reason",) * n + ("base",) * n, seeds + seeds, temperature=temp,
                                    max_new_tokens=max_new_tokens))
            where.append(trace)
    if not jobs:
        return pd.DataFrame(columns=EFFECT_COLUMNS)
    finished = [0]

    def tick(_done: int, _total: int) -> None:  # the driver reports once per finished batch, i.e. per position
        finished[0] += 1
        if progress is not None:
            progress(finished[0], total)

    out = executor.run_jobs(pair, jobs, store=store, on_trace=grade_trace, progress=tick, should_stop=should_stop)
    rows, values = [], {}
    for job, trace, kids in zip(jobs, where, out):
        if id(trace) not in values:
            values[id(trace)] = np.asarray(score_values(trace.metrics, score), dtype=np.float64)
        n = job.units // 2
        top = [pair.token_text(int(trace.topk[side][0][job.pos, 0])) for side in ("base", "reason")]
        rows.append(_effect_row(trace, job.pos, kids[:n], kids[n:], values[id(trace)][job.pos], *top))
    return pd.DataFrame(rows, columns=EFFECT_COLUMNS)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=EFFECT_COLUMNS)


def _effect_row(trace: Trace, pos: int, with_: list[Trace], without: list[Trace], score: float, base_token: str,
                reason_token: str) -> dict[str, Any]:
    """One row of the effects table from the graded continuations of both arms."""
    n = len(with_)
    s1, s2 = _correct(with_), _correct(without)
    low, high = newcombe(s1, n, s2, len(without))
    return {
        "trace": trace.key, "pos": pos, "token": trace.tokens[pos], "base_token": base_token,
        "reason_token": reason_token, "score": float(score), "acc_with": s1 / n, "acc_without": s2 / len(without),
        "effect": s1 / n - s2 / len(without), "ci_low": low, "ci_high": high, "n": n,
        **dict(zip(("with_low", "with_high"), wilson(s1, n))),
        **dict(zip(("without_low", "without_high"), wilson(s2, len(without)))),
        "interval": INTERVAL, "keys_with": " ".join(str(t.key) for t in with_),
        "keys_without": " ".join(str(t.key) for t in without),
    }


def stored_effects(store: Any, trace: Trace, *, score: str = settings.SCORE,
                   children: Sequence[str] | None = None) -> pd.DataFrame:
    """The `takeover_effects` rows that the continuations already in `store` give (no decoding): one per
    (position, temperature) with both arms measured. base_token / reason_token are then the token each
    arm wrote most often at pos (no tokenizer is needed). `children`: the trace's children keys when known
    (`store.children_index()` once for many traces: each `store.children` call lists the store)."""
    check_score(score)
    arms: dict[tuple[int, float], dict[str, list[Trace]]] = {}
    for key in store.children(trace.key) if children is None else children:
        meta = store.meta(key)  # the footer: a switchboard's children (most of them) are never read whole here
        switch = meta.get("branch") or {}
        if switch.get("who") not in ("reason", "base") or meta.get("correct") is None:
            continue  # a user's branch, or an ungraded one
        temp = float((meta.get("sampling") or {}).get("temperature") or 0.0)
        arms.setdefault((int(switch["pos"]), temp), {"reason": [], "base": []})[switch["who"]].append(store.get(key))
    values = np.asarray(score_values(trace.metrics, score), dtype=np.float64)
    rows = []
    for (pos, _temp), both in sorted(arms.items()):
        if both["reason"] and both["base"] and pos < len(trace):
            common = [pd.Series([k.tokens[pos] for k in both[w]]).mode().iloc[0] for w in ("base", "reason")]
            rows.append(_effect_row(trace, pos, both["reason"], both["base"], values[pos], *common))
    return pd.DataFrame(rows, columns=EFFECT_COLUMNS)


EFFECTS_LAYER = "effects"  # the annotation layer the token view marks (core/views/heatmap.py)


def effects_layer(effects: pd.DataFrame) -> list[dict[str, Any]]:
    """An effects table as the "effects" annotation layer: per row pos, effect, its interval, both accuracies, n."""
    cols = ["pos", "effect", "ci_low", "ci_high", "acc_with", "acc_without", "n"]
    return [{"pos": int(r[0]), **{c: float(v) for c, v in zip(cols[1:-1], r[1:-1])}, "n": int(r[-1])}
            for r in effects[cols].itertuples(index=False)]


def attach_effects(store: Any, trace: Trace, *, score: str = settings.SCORE) -> Trace:
    """The trace with the effects measured on it so far (`stored_effects`) as its "effects" annotation layer,
    which the token view marks; a trace with none is returned unchanged. Token data is never touched."""
    frame = stored_effects(store, trace, score=score) if trace.key else pd.DataFrame()
    return trace.annotate(**{EFFECTS_LAYER: effects_layer(frame)}) if len(frame) else trace


def effects_stamp(store: Any, key: str) -> str:
    """A cheap tag that changes whenever a continuation of trace `key` is stored (for caches keyed by it)."""
    kids = store.children(key)
    return f"{len(kids)}:{hashlib.blake2b(' '.join(sorted(kids)).encode(), digest_size=6).hexdigest()}" if kids else ""


def effect_correlation(effects: pd.DataFrame) -> float:
    """Spearman's rank correlation of effect and disagreement score over measured positions (does
    disagreement predict importance?)."""
    return spearman(effects["score"], effects["effect"])
