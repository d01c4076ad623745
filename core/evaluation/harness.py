"""Evaluation harness: problems x policies x samples -> graded traces -> accuracy, pass@k, realised rate,
recovery of the base-to-reference gap; plus a budget sweep (recovery vs realised takeover rate ρ).

Every trace goes through the store when one is given, so a rerun (or a run over another shard)
skips what is stored. Grading uses `core.grading.grade` on the response text against the gold answer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from core.errors import InvalidInputError
from core.decoding.policies import BaseOnly, EarlyOnly, Guided, Policy, RandomPositions, ReasonOnly

log = logging.getLogger(__name__)

BASE, REFERENCE = "base", "reason"
SUMMARY_COLUMNS = ("benchmark", "policy", "problems", "samples", "accuracy", "pass@k", "k", "rho",
                   "mean_tokens", "recovery", "recovery@k")


# -- pure maths --------------------------------------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise InvalidInputError(f"pass@k needs 0 ≤ c ≤ n and 1 ≤ k ≤ n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def recovery(p_policy: float, p_base: float, p_reference: float) -> float:
    """(P_policy - P_base) / (P_reference - P_base); NaN when the reference does not beat the base."""
    gap = p_reference - p_base
    return float((p_policy - p_base) / gap) if gap > 0 else float("nan")


def early_rate_for(rho: float, mean_tokens: float, max_new_tokens: int) -> float:
    """EarlyOnly's `rate` whose prefix (ceil(rate · max_new_tokens) tokens) is the whole number of
    tokens closest to a realised rate `rho` on responses of `mean_tokens` tokens (at least one)."""
    n = max(1, round(rho * mean_tokens))
    return min(1.0, n / max_new_tokens)


def shard_of(items: Sequence[Any], shard: tuple[int, int] | None) -> list[Any]:
    """The items of shard (i, n): every n-th item starting at i (deterministic, disjoint, covering)."""
    if shard is None:
        return list(items)
    i, n = shard
    if not (isinstance(n, int) and n >= 1 and isinstance(i, int) and 0 <= i < n):
        raise InvalidInputError(f"shard must be (i, n) with 0 ≤ i < n, got {shard!r}")
    return [x for j, x in enumerate(items) if j % n == i]


# -- running -----------------------------------------------------------------------------------
class _GradingStore:
    """Wraps a store (or nothing) so that every new trace is graded before it is written."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def __contains__(self, key: object) -> bool:
        return self.store is not None and key in self.store

    def get(self, key: str) -> Any:
        return self.store.get(key)

    def put(self, trace: Any) -> Any:
        _grade_trace(trace)
        return self.store.put(trace) if self.store is not None else None


def _grade_trace(trace: Any) -> None:
    from core.evaluation.grading import extract_answer, grade

    gold = (trace.meta.get("problem") or {}).get("gold")
    if gold is None or trace.meta.get("correct") is not None:
        return
    trace.meta["answer"] = extract_answer(trace.text)
    trace.meta["correct"] = bool(grade(trace.text, str(gold)))


def _named(policies: Mapping[str, Policy] | Iterable[Policy]) -> dict[str, Policy]:
    if isinstance(policies, Mapping):
        named = dict(policies)
    else:
        named = {}
        for p in policies:
            label, n = p.name, 2
            while label in named:
                label, n = f"{p.name}_{n}", n + 1
            named[label] = p
    for label, policy in named.items():
        if not isinstance(policy, Policy):
            raise InvalidInputError(f"policy {label!r} is a {type(policy).__name__}, not a core Policy")
    return named


def _benchmarks(problems: Any) -> dict[str, list[Any]]:
    if isinstance(problems, Mapping):
        return {str(name): list(ps) for name, ps in problems.items()}
    return {"problems": list(problems)}


def run_records(pair: Any, problems: Any, policies: Mapping[str, Policy] | Iterable[Policy], *,
                samples: int = 1, store: Any = None, temperature: float = 0.0, top_p: float = 1.0,
                seed: int = 0, max_new_tokens: int = 256, shard: tuple[int, int] | None = None,
                batch_size: int = 64, progress: Callable[[int, int], None] | None = None,
                keep: dict[str, list[Any]] | None = None) -> pd.DataFrame:
    """One row per generated trace: benchmark, policy, problem, sample, correct, tokens, taken, key.

    `problems` is a list (one benchmark) or {benchmark: list}. Rows come from the store when present.
    With `keep` (a dict), the traces are also collected there, keep[policy label] -> list of Trace.
    """
    from core.decoding.engine import generate

    if samples < 1:
        raise InvalidInputError(f"samples must be ≥ 1, got {samples}")
    if samples > 1 and temperature == 0.0:
        log.warning("%d samples at temperature 0 are identical; pass@k equals accuracy", samples)
    named = _named(policies)
    # (global index in its benchmark, problem): indices stay unique when shards are concatenated
    benches = {name: shard_of(list(enumerate(ps)), shard) for name, ps in _benchmarks(problems).items()}
    grading = _GradingStore(store)
    total = sum(len(ps) for ps in benches.values()) * len(named)
    done, rows = 0, []
    for bench, ps in benches.items():
        for label, policy in named.items():
            for start in range(0, len(ps), batch_size):
                indices = [i for i, _ in ps[start:start + batch_size]]
                chunk = [p for _, p in ps[start:start + batch_size]]
                traces = generate(pair, chunk, policy, max_new_tokens=max_new_tokens, temperature=temperature,
                                  top_p=top_p, seed=seed, samples=samples, store=grading)
                traces = traces if isinstance(traces, list) else [traces]
                if keep is not None:
                    keep.setdefault(label, []).extend(traces)
                for j, trace in enumerate(traces):
                    _grade_trace(trace)  # traces stored by an older run may lack a grade
                    src = np.asarray(trace.source)
                    rows.append({
                        "benchmark": bench, "policy": label, "problem": trace.meta["problem"].get("id"),
                        "index": indices[j // samples], "sample": j % samples,
                        "correct": bool(trace.meta.get("correct")), "tokens": len(trace),
                        "taken": int((src != "base").sum()), "key": trace.key,
                    })
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
    return pd.DataFrame(rows)


def summarise(records: pd.DataFrame, k: int | None = None, base: str = BASE,
              reference: str = REFERENCE) -> pd.DataFrame:
    """Per benchmark and policy: accuracy, unbiased pass@k, realised ρ (token-weighted), mean tokens,
    and recovery of the gap between the `base` and `reference` policy rows (on accuracy and pass@k)."""
    out = []
    for (bench, label), g in records.groupby(["benchmark", "policy"], sort=False):
        per = g.groupby("index")["correct"].agg(["size", "sum"])
        n_min = int(per["size"].min())
        kk = n_min if k is None else k
        if kk > n_min:
            raise InvalidInputError(f"pass@{kk} needs ≥ {kk} samples per problem; policy {label!r} has {n_min}")
        out.append({
            "benchmark": bench, "policy": label, "problems": len(per), "samples": n_min,
            "accuracy": float(g["correct"].mean()),
            "pass@k": float(np.mean([pass_at_k(int(n), int(c), kk) for n, c in zip(per["size"], per["sum"])])),
            "k": kk, "rho": float(g["taken"].sum() / max(1, g["tokens"].sum())),
            "mean_tokens": float(g["tokens"].mean()),
        })
    frame = pd.DataFrame(out, columns=[c for c in SUMMARY_COLUMNS if c not in ("recovery", "recovery@k")])
    for col, metric in (("recovery", "accuracy"), ("recovery@k", "pass@k")):
        values = []
        for _, row in frame.iterrows():
            bench = frame[frame["benchmark"] == row["benchmark"]].set_index("policy")[metric]
            if base in bench and reference in bench:
                values.append(recovery(row[metric], bench[base], bench[reference]))
            else:
                values.append(float("nan"))
        frame[col] = values
    return frame


def evaluate(pair: Any, problems: Any, policies: Mapping[str, Policy] | Iterable[Policy], samples: int = 1,
             store: Any = None, reference: str = REFERENCE, temperature: float = 0.0, seed: int = 0,
             shard: tuple[int, int] | None = None, progress: Callable[[int, int], None] | None = None,
             *, top_p: float = 1.0, max_new_tokens: int = 256, k: int | None = None,
             batch_size: int = 64) -> pd.DataFrame:
    """Run problems x policies x samples, grade, and summarise (see `summarise`), one row per
    benchmark and policy. BaseOnly ("base") and ReasonOnly ("reason") are added when missing, since
    recovery needs both; `reference` names the row recovery is measured against."""
    named = _named(policies)
    kinds = {type(p) for p in named.values()}
    extra: dict[str, Policy] = {}
    if BASE not in named and BaseOnly not in kinds:
        extra[BASE] = BaseOnly()
    if reference == REFERENCE and REFERENCE not in named and ReasonOnly not in kinds:
        extra[REFERENCE] = ReasonOnly()
    named = {**extra, **named}
    base_label = next(label for label, p in named.items() if isinstance(p, BaseOnly))
    if reference not in named:
        raise InvalidInputError(f"reference {reference!r} is not a policy label; choose one of: {', '.join(named)}")
    records = run_records(pair, problems, named, samples=samples, store=store, temperature=temperature,
                          top_p=top_p, seed=seed, max_new_tokens=max_new_tokens, shard=shard,
                          batch_size=batch_size, progress=progress)
    return summarise(records, k=k, base=base_label, reference=reference)


# -- budget sweep ------------------------------------------------------------------------------
def budget_sweep(pair: Any, problems: Sequence[Any], calibration: Sequence[Any],
                 ratios: Sequence[float] = (0.01, 0.02, 0.05, 0.1), *, window: int = 16, budget: float = 0.1,
                 baselines: bool = True, samples: int = 1, store: Any = None, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, max_new_tokens: int = 256, batch_size: int = 64,
                 progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Recovery vs realised ρ: for each calibration ratio r, a Guided policy calibrated on base
    rollouts of `calibration`, and (with `baselines`) RandomPositions and EarlyOnly at the realised ρ
    Guided reached. Columns: ratio, policy, rho, accuracy, pass@k, recovery, recovery@k (+ gate)."""
    from core.decoding.engine import calibrate

    common = dict(samples=samples, store=store, temperature=temperature, top_p=top_p, seed=seed,
                  max_new_tokens=max_new_tokens, batch_size=batch_size)
    ends = summarise(run_records(pair, problems, {BASE: BaseOnly(), REFERENCE: ReasonOnly()}, **common))
    p = ends.set_index("policy")
    mean_tokens = float(p.loc[BASE, "mean_tokens"])
    rows = [{"ratio": float("nan"), **r} for r in ends.to_dict("records")]
    for i, ratio in enumerate(ratios):
        gate = calibrate(pair, list(calibration), ratio=ratio, window=window, temperature=temperature, seed=seed,
                         max_new_tokens=max_new_tokens, batch_size=batch_size, store=store)
        guided = summarise(run_records(pair, problems, {"guided": Guided.from_gate(gate, budget=budget)}, **common))
        rho = float(guided["rho"].iloc[0])
        found = [{"ratio": ratio, "tau": gate.tau, "lam": gate.lam, "window": gate.window,
                  **guided.iloc[0].to_dict()}]
        if baselines and rho > 0:
            # EarlyOnly hands over the first ceil(rate · max_new_tokens) tokens: match ρ on mean length
            others = {"random_positions": RandomPositions(rate=min(1.0, rho), seed=seed),
                      "early_only": EarlyOnly(rate=early_rate_for(rho, mean_tokens, max_new_tokens))}
            base_summary = summarise(run_records(pair, problems, others, **common))
            found += [{"ratio": ratio, **r} for r in base_summary.to_dict("records")]
        for r in found:
            r["recovery"] = recovery(r["accuracy"], p.loc[BASE, "accuracy"], p.loc[REFERENCE, "accuracy"])
            r["recovery@k"] = recovery(r["pass@k"], p.loc[BASE, "pass@k"], p.loc[REFERENCE, "pass@k"])
        rows += found
        if progress is not None:
            progress(i + 1, len(ratios))
    return pd.DataFrame(rows)


# -- output ------------------------------------------------------------------------------------
def to_markdown(frame: pd.DataFrame, index: str = "policy", columns: Sequence[str] | None = None,
                digits: int = 3) -> str:
    """A GitHub markdown table of `frame` (rows by `index`; with several benchmarks, one column per
    benchmark and metric, "bench: metric"). Numbers are rounded to `digits`; NaN shows as "–"."""
    metrics = list(columns or [c for c in ("accuracy", "pass@k", "rho", "mean_tokens", "recovery")
                               if c in frame.columns])
    if "benchmark" in frame.columns and frame["benchmark"].nunique() > 1:
        wide = frame.pivot(index=index, columns="benchmark", values=metrics)
        order = list(dict.fromkeys(frame[index]))
        wide = wide.reindex(order)
        header = [index] + [f"{b}: {m}" for m, b in wide.columns]
        body = [[str(label)] + [_fmt(v, digits) for v in row] for label, row in zip(wide.index, wide.values)]
    else:
        header = [index] + metrics
        body = [[str(r[index])] + [_fmt(r[m], digits) for m in metrics] for _, r in frame.iterrows()]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in body]
    return "\n".join(lines)


def _fmt(value: Any, digits: int) -> str:
    if isinstance(value, (float, np.floating)):
        return "–" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)
