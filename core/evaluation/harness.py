"""Evaluation harness: problems x policies x samples -> graded traces -> accuracy, pass@k, realised rate ρ
and recovery of the base-to-reference gap (one row per benchmark and policy, `policy_table`).

Generation runs through `core.decoding.generate_many` (the one batch loop); every trace is graded by
`core.evaluation.grading.grade_trace` (the one rule) before it is stored, so a rerun (or a run over another
shard) skips what is stored and an older ungraded copy gains its grade.
The recovery reference is a policy label (e.g. "thinking": a same-size thinking model run alone, as in
the paper), or numbers the user supplies per benchmark; every table says which one it used.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Union

import numpy as np
import pandas as pd

from core import settings
from core.decoding import generate_many
from core.decoding.policies import BaseOnly, Policy, ReasonOnly, policy_spec
from core.errors import ForkpointError, InvalidInputError
from core.evaluation.grading import GRADER, gold_text, grade_trace
from core.evaluation.problems import ANSWER_FIELDS
from core.evaluation.record_table import RECORD_COLUMNS, RecordTable, record_groups  # noqa: F401  RECORD_COLUMNS: re-exported
from core.evaluation.thinking import Solo
from core.io.stored_traces import StoredTraces
from core.record.problems import problem_record
from core.settings import Progress
from core.trace import RowSummary, answer_rule_of

log = logging.getLogger(__name__)

BASE, GUIDE, THINKING = "base", "reason", "thinking"
REFERENCE = GUIDE  # evaluate()'s default reference when no thinking model is given (not the paper's)
# accuracy + wrong + ungraded = 1: "ungraded" is the share of samples from which no answer was extracted
POLICY_TABLE_COLUMNS = ("benchmark", "policy", "problems", "samples", "accuracy", "wrong", "ungraded", "pass@k", "k",
                        "rho", "mean_tokens", "recovery", "recovery@k", "reference")
# A reference: a policy label, a Pass@k number, or per benchmark a number or {"accuracy": x, "pass@k": y}.
Reference = Union[str, float, Mapping[str, Union[float, Mapping[str, float]]]]


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
def named_policies(policies: Mapping[str, Policy] | Iterable[Policy]) -> dict[str, Policy]:
    """{label: policy}; a plain list is labelled by policy names (repeats get _2, _3, ...)."""
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


def benchmarks_of(problems: Any) -> dict[str, list[Any]]:
    """{benchmark: problems}: a mapping as is, a plain list as one benchmark named "problems"."""
    if isinstance(problems, Mapping):
        return {str(name): list(ps) for name, ps in problems.items()}
    return {"problems": list(problems)}


def _ungraded(row: dict[str, Any]) -> bool:
    """A stored row the driver must read again: stored before it was graded, or graded by an older rule set."""
    return row.get("correct") is None or row.get("grader") != GRADER


def keeps_in_store(store: Any) -> bool:
    """Whether traces kept for later (`keep=`) can live in `store` as keys (a real TraceStore) rather than
    in memory."""
    return hasattr(store, "summary") and hasattr(store, "get")


def keep_traces(keep: dict[str, Any], label: str, traces: Any, store: Any = None) -> None:
    """Add `traces` (a list, or a `StoredTraces`) to keep[label]: as keys when they are in a TraceStore."""

    if label not in keep:
        keep[label] = StoredTraces(store) if keeps_in_store(store) else []
    keep[label].extend(traces)


def run_records(pair: Any, problems: Any, policies: Mapping[str, Policy] | Iterable[Policy], *,
                samples: int = settings.SAMPLES, store: Any = None, temperature: float = settings.TEMPERATURE,
                top_p: float = settings.TOP_P, seed: int = settings.SEED,
                max_new_tokens: int = settings.MAX_NEW_TOKENS, shard: tuple[int, int] | None = None,
                batch_size: int = settings.BATCH_SIZE, progress: Progress | None = None,
                keep: dict[str, Any] | None = None, executor: Any = None) -> pd.DataFrame:
    """One row per generated trace (RECORD_COLUMNS): benchmark, policy, problem, index, sample, correct,
    tokens, taken, key, as a DataFrame (`stream_records` gives the same rows in a `RecordTable` on disk)."""
    with stream_records(pair, problems, policies, samples=samples, store=store, temperature=temperature, top_p=top_p,
                        seed=seed, max_new_tokens=max_new_tokens, shard=shard, batch_size=batch_size,
                        progress=progress, keep=keep, executor=executor) as table:
        return table.frame()


def stream_records(pair: Any, problems: Any, policies: Mapping[str, Policy] | Iterable[Policy], *,
                   samples: int = settings.SAMPLES, store: Any = None, temperature: float = settings.TEMPERATURE,
                   top_p: float = settings.TOP_P, seed: int = settings.SEED,
                   max_new_tokens: int = settings.MAX_NEW_TOKENS, shard: tuple[int, int] | None = None,
                   batch_size: int = settings.BATCH_SIZE, progress: Progress | None = None,
                   keep: dict[str, Any] | None = None, executor: Any = None,
                   into: RecordTable | None = None) -> RecordTable:
    """The records of problems x policies x samples (RECORD_COLUMNS), written batch by batch into a
    `RecordTable` (`into`, or a new temporary one) as batches finish. `problems` is a list (one benchmark)
    or {benchmark: list}. Rows come from the store when present. With `keep` (a dict), traces are also
    collected, keep[policy label] -> traces (with a TraceStore: a `StoredTraces`, keys read back one trace
    at a time; without: a list). `executor` (e.g. `core.RayExecutor()`) makes the traces elsewhere; grading
    and the table stay here. Without `keep` the driver holds one batch's summaries (`RowSummary`) at a
    time, never token arrays, and a resume reads stored rows from the store's index."""

    if samples < 1:
        raise InvalidInputError(f"samples must be ≥ 1, got {samples}")
    if samples > 1 and temperature == 0.0:
        log.warning("%d samples at temperature 0 are identical; pass@k equals accuracy", samples)
    named = named_policies(policies)
    # (global index in its benchmark, problem): indices stay unique when shards are concatenated
    benches = {name: shard_of(list(enumerate(ps)), shard) for name, ps in benchmarks_of(problems).items()}
    total = sum(len(ps) for ps in benches.values()) * len(named)
    mode = "summaries" if keep is None or keeps_in_store(store) else "traces"
    table = RecordTable() if into is None else into
    done = 0
    for bench, ps in benches.items():
        for label, policy in named.items():
            def step(rows_done: int, _rows: int, _done: int = done) -> None:
                if progress is not None:
                    progress(_done + rows_done // samples, total)

            start = table.next_seq()

            def add(batch: int, rows: Sequence[Any], _start: int = start, _bench: str = bench, _label: str = label,
                    _ps: Sequence[tuple[int, Any]] = ps) -> None:
                first = batch * batch_size * samples  # the batch's first row in this stage
                table.add(_start + first, _bench, _label,
                          [(_ps[(first + j) // samples][0], (first + j) % samples,
                            r if isinstance(r, RowSummary) else RowSummary.of_trace(r)) for j, r in enumerate(rows)])

            made = generate_many(pair, [p for _, p in ps], policy, samples=samples, batch_size=batch_size,
                                 max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                                 store=store, on_trace=grade_trace, progress=step, executor=executor, keep=mode,
                                 recheck=_ungraded, on_rows=add if keep is None else None)
            if keep is not None:
                keep_traces(keep, label, [r.key for r in made] if mode == "summaries" else made, store)
                add(0, made)
            done += len(ps)
    return table


def require_gold(problems: Any) -> None:
    """Raise unless every problem (a list, or {benchmark: list}) has a gold answer: accuracy and recovery
    need each trace graded, and an ungradable one would silently count as wrong."""
    for bench, ps in benchmarks_of(problems).items():
        if not ps:
            raise InvalidInputError(f"No problems to evaluate in {bench!r} (an empty set, or a shard or split "
                                    "that left none)")
        missing = [p for p in ps if gold_text(problem_record(p)["gold"]) is None]
        if not missing:
            continue
        first = problem_record(missing[0])
        raise InvalidInputError(
            f"{len(missing)} of {len(ps)} problems of {bench!r} have no gold answer (first: id "
            f"{first['id']!r}, {first['prompt'][:60]!r}); evaluation grades every trace, so each problem needs "
            f"one: rename the answer's field to one of {', '.join(ANSWER_FIELDS)} (in Python, "
            "load_problems(..., answer_field=NAME) reads another)")


def policy_config_label(policy: dict | None) -> str:
    """A policy configuration's name: its registry name plus its declared numeric parameters."""
    policy = policy or {}
    params = policy.get("params") or {}
    try:
        declared = [p.name for p in policy_spec(str(policy.get("name"))).params if p.kind in (int, float)]
    except ForkpointError:
        declared = []
    keep = {k: params[k] for k in declared if params.get(k) is not None}
    return f"{policy.get('name')} {json.dumps(keep, sort_keys=True)}" if keep else str(policy.get("name"))


def stored_policy_table(traces: Iterable[Any]) -> pd.DataFrame:
    """Accuracy, realised ρ and recovery (k = 1) per policy configuration of stored, graded root traces
    (branches left out), against the BaseOnly and ReasonOnly traces among them; "name" is the configuration
    (`policy_config_label`), "policy" its registry name. Every row is over the problems that configuration
    shares with both ends ("problems" counts them; the ends' rows over the problems they share), so a recovery
    never compares runs on different problems; a configuration that shares none is left out with a warning.
    InvalidInputError when either end is missing."""
    rows = []
    for t in traces:
        if t.meta.get("correct") is None or t.meta.get("parent"):
            continue
        rows.append({"benchmark": "store", "policy": policy_config_label(t.meta.get("policy")),
                     "index": str((t.meta.get("problem") or {}).get("id")), "correct": bool(t.meta["correct"]),
                     "tokens": len(t), "taken": t.n_takeovers, "answer_rule": answer_rule_of(t.meta)})
    records = pd.DataFrame(rows)
    ends = ("base_only", "reason_only")
    if records.empty or not set(ends) <= set(records["policy"]):
        raise InvalidInputError("Recovery needs graded BaseOnly and ReasonOnly traces (generate both: the app's "
                                "Generate page or `forkpoint generate`), plus the policies to compare")
    problems = records.groupby("policy", sort=False)["index"].agg(set)
    both_ends = problems[ends[0]] & problems[ends[1]]
    if not both_ends:
        raise InvalidInputError("Recovery needs BaseOnly and ReasonOnly traces of the same problems; the stored ones "
                                "share none")
    parts, unpaired = [], []
    for label, own in problems.items():
        shared = both_ends if label in ends else own & both_ends
        if not shared:
            unpaired.append(label)
            continue
        paired = records[records["index"].isin(shared) & records["policy"].isin((label, *ends))]
        table = policy_table(paired, k=1, base=ends[0], reference=ends[1])
        parts.append(table[table["policy"] == label])
    if unpaired:
        log.warning("recovery leaves out %s: no problem of theirs has both a BaseOnly and a ReasonOnly trace",
                    ", ".join(unpaired))
    frame = pd.concat(parts, ignore_index=True)
    frame["name"] = frame["policy"]
    frame["policy"] = frame["policy"].str.split(" ", n=1).str[0]
    return frame


# -- summarising -------------------------------------------------------------------------------
def reference_values(table: pd.DataFrame, bench: str, reference: Reference) -> tuple[float, float, str]:
    """(reference accuracy, reference pass@k, description) for one benchmark of a policy table."""
    if isinstance(reference, str):
        rows = table[(table["benchmark"] == bench) & (table["policy"] == reference)]
        if rows.empty:
            return float("nan"), float("nan"), f"policy {reference} (missing)"
        return float(rows["accuracy"].iloc[0]), float(rows["pass@k"].iloc[0]), f"policy {reference}"
    value: Any = reference.get(bench, reference.get("*")) if isinstance(reference, Mapping) else reference
    if value is None:
        return float("nan"), float("nan"), "given numbers (none for this benchmark)"
    if isinstance(value, Mapping):
        bad = set(value) - {"accuracy", "pass@k"}
        if bad:
            raise InvalidInputError(f"reference numbers take keys accuracy and pass@k, got {sorted(bad)}")
        return float(value.get("accuracy", math.nan)), float(value.get("pass@k", math.nan)), "given numbers"
    if not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise InvalidInputError(f"a reference number is a Pass@k in [0, 1], got {value!r} for {bench!r}")
    return float("nan"), float(value), "given Pass@k"


def policy_table(records: pd.DataFrame | RecordTable, k: int | None = None, base: str = BASE,
                 reference: Reference = REFERENCE) -> pd.DataFrame:
    """Per benchmark and policy (POLICY_TABLE_COLUMNS): accuracy, the shares answered wrong and ungraded
    (no answer extracted; NaN when the records lack "answer_rule"), unbiased pass@k, realised ρ
    (token-weighted), mean tokens, and recovery of the gap between the `base` row and the `reference`
    (a policy label or numbers, see `reference_values`) on accuracy and on pass@k ("recovery@k").
    `records`: a DataFrame, or a `RecordTable` on disk (aggregated by SQLite: the same numbers, in memory
    bounded by the number of problems of one group)."""
    out = []
    for g in record_groups(records):
        n_min = int(g.sizes.min())
        kk = n_min if k is None else k
        if kk > n_min:
            raise InvalidInputError(f"pass@{kk} needs ≥ {kk} samples per problem; policy {g.policy!r} has {n_min}")
        wrong, ungraded = ((float("nan"), float("nan")) if g.wrong is None or not g.rows else
                           (g.wrong / g.rows, g.ungraded / g.rows))
        out.append({
            "benchmark": g.benchmark, "policy": g.policy, "problems": len(g.sizes), "samples": n_min,
            "accuracy": g.correct / g.rows, "wrong": wrong, "ungraded": ungraded,
            "pass@k": float(np.mean([pass_at_k(int(n), int(c), kk) for n, c in zip(g.sizes, g.sums)])),
            "k": kk, "rho": float(g.taken / max(1, g.tokens)), "mean_tokens": g.tokens / g.rows,
        })
    frame = pd.DataFrame(out, columns=list(POLICY_TABLE_COLUMNS[:-3]))
    return add_recovery(frame, base=base, reference=reference)


def add_recovery(frame: pd.DataFrame, base: str = BASE, reference: Reference = REFERENCE,
                 ends: pd.DataFrame | None = None) -> pd.DataFrame:
    """`frame` with recovery, recovery@k and reference columns, base and reference rows looked up in
    `ends` (default: `frame` itself), per benchmark."""
    ends = frame if ends is None else ends
    rec, rec_k, names = [], [], []
    for _, row in frame.iterrows():
        b = ends[(ends["benchmark"] == row["benchmark"]) & (ends["policy"] == base)]
        ref_acc, ref_k, name = reference_values(ends, row["benchmark"], reference)
        acc_b = float(b["accuracy"].iloc[0]) if len(b) else float("nan")
        k_b = float(b["pass@k"].iloc[0]) if len(b) else float("nan")
        rec.append(recovery(row["accuracy"], acc_b, ref_acc))
        rec_k.append(recovery(row["pass@k"], k_b, ref_k))
        names.append(name)
    return frame.assign(recovery=rec, **{"recovery@k": rec_k}, reference=names)


def evaluate(pair: Any, problems: Any, policies: Mapping[str, Policy] | Iterable[Policy],
             samples: int = settings.SAMPLES, store: Any = None, reference: Reference | None = None,
             temperature: float = settings.TEMPERATURE, seed: int = settings.SEED,
             shard: tuple[int, int] | None = None, progress: Progress | None = None,
             *, top_p: float = settings.TOP_P, max_new_tokens: int = settings.MAX_NEW_TOKENS, k: int | None = None,
             batch_size: int = settings.BATCH_SIZE, thinking: Any = None, executor: Any = None) -> pd.DataFrame:
    """Run problems x policies x samples, grade, and summarise (`policy_table`), one row per benchmark
    and policy. BaseOnly ("base") and ReasonOnly ("reason", the guide) are added when missing. With
    `thinking` (a pair from `core.evaluation.thinking.load_thinking`), its model's solo run is the "thinking"
    row and the default reference, as in the paper; else the default reference is the guide.
    `executor`: where the traces are made (None: here; `core.RayExecutor()`: Ray workers, same table)."""
    named = named_policies(policies)
    kinds = {type(p) for p in named.values()}
    extra: dict[str, Policy] = {}
    if BASE not in named and BaseOnly not in kinds:
        extra[BASE] = BaseOnly()
    if GUIDE not in named and ReasonOnly not in kinds:
        extra[GUIDE] = ReasonOnly()
    named = {**extra, **named}
    base_label = next(label for label, p in named.items() if isinstance(p, BaseOnly))
    if reference is None:
        reference = THINKING if thinking is not None else GUIDE
    common = dict(samples=samples, store=store, temperature=temperature, top_p=top_p, seed=seed,
                  max_new_tokens=max_new_tokens, shard=shard, batch_size=batch_size, executor=executor)
    require_gold(problems)
    with stream_records(pair, problems, named, progress=progress, **common) as records:
        if thinking is not None:
            stream_records(thinking, problems, {THINKING: Solo()}, into=records, **common)
        labels = records.policies()
        if isinstance(reference, str) and reference not in labels:
            raise InvalidInputError(f"reference {reference!r} is not a policy label; choose one of: "
                                    f"{', '.join(map(str, labels))}, or give numbers")
        return policy_table(records, k=k, base=base_label, reference=reference)


def thinking_records(thinking: Any, problems: Any, **common: Any) -> pd.DataFrame:
    """Records of the thinking model writing every token alone (`Solo` on a `load_thinking` pair)."""

    return run_records(thinking, problems, {THINKING: Solo()}, **common)


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
