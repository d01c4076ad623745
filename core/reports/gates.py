"""The gate shoot-out (`core.compare_gates`): which gate knows *when*? Every gate of the policy registry that has
a knob, each set by the one equal-ρ calibration (`core.decoding.calibration.equal_rho`) on base rollouts of
held-out calibration problems, at each target ρ, run on the same problems and samples as the base; per gate
and ρ: realised ρ, accuracy, pass@k, recovery, flips against the base per problem, the reasoner's
evaluations per token and wall seconds per token.

It reuses the harness: `stream_records` makes and grades the traces (stored, resumable), `policy_table` and
`add_recovery` summarise them, `sweep.calibration_rollouts` makes the calibration rollouts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from core import settings
from core.decoding.calibration import build_policy, rollout_rho
from core.decoding.policies import BaseOnly, ReasonOnly, policy_spec
from core.errors import InvalidInputError
from core.evaluation.harness import (
    BASE,
    GUIDE,
    THINKING,
    Reference,
    add_recovery,
    keep_traces,
    policy_table,
    require_gold,
    stream_records,
)
from core.evaluation.record_table import RecordTable
from core.evaluation.sweep import calibration_rollouts
from core.evaluation.thinking import Solo
from core.io.csvsafe import write_csv
from core.pair.forward import ForwardCount, count_forwards
from core.settings import Progress, StageProgress
from core.trace import decode_seconds

log = logging.getLogger(__name__)

GATES = ("guided", "entropy_gated", "top_prob", "margin", "router", "random_positions", "early_only")
DEFAULT_GATE_RHOS = settings.GATE_RHOS
GATE_COLUMNS = ("benchmark", "gate", "label", "target_rho", "calibrated_rho", "rho", "accuracy", "pass@k", "k",
                "recovery", "recovery@k", "wrong_to_right", "right_to_wrong", "problems", "samples",
                "reason_evals_per_token", "reason_forwards_per_token", "wall_s_per_token", "knob", "knob_value",
                "mean_tokens", "reference")


def gate_label(gate: str, rho: float) -> str:
    """"top_prob ρ=0.05": one row of the shoot-out."""
    return f"{gate} ρ={rho:g}"


def problem_right(records: pd.DataFrame) -> pd.Series:
    """Per (benchmark, index): whether the problem counts as solved, i.e. at least half its samples are correct."""
    return records.groupby(["benchmark", "index"])["correct"].mean() >= 0.5


def flips(records: pd.DataFrame, label: str, base: str = BASE) -> pd.DataFrame:
    """Per benchmark: problems the base got wrong and policy `label` right (wrong_to_right), and the reverse,
    a problem being right when at least half its samples are (`problem_right`); problems both ran only."""
    mine = problem_right(records[records["policy"] == label])
    theirs = problem_right(records[records["policy"] == base])
    both = mine.index.intersection(theirs.index)
    mine, theirs = mine.loc[both], theirs.loc[both]
    frame = pd.DataFrame({"up": mine & ~theirs, "down": ~mine & theirs})
    out = frame.groupby(level="benchmark").sum()
    return pd.DataFrame({"benchmark": out.index, "wrong_to_right": out["up"].astype(int).to_numpy(),
                         "right_to_wrong": out["down"].astype(int).to_numpy()})


def reason_evals_per_token(policy: Any, records: pd.DataFrame) -> float:
    """The reasoner's evaluations that decoding needs, per generated token: a lazy gate asks it only where it
    fires (takeovers / tokens; the metrics of the other positions are filled in one batched pass afterwards),
    every other policy scores each position with it (1.0)."""
    tokens = float(records["tokens"].sum())
    if not tokens:
        return math.nan
    return float(records["taken"].sum()) / tokens if type(policy).lazy else 1.0


def compare_gates(pair: Any, problems: Any, calibration: Sequence[Any], ratios: Sequence[float] = DEFAULT_GATE_RHOS,
                  *, gates: Sequence[str] = GATES, router: str | None = None, params: Mapping[str, dict] | None = None,
                  samples: int = settings.SAMPLES, thinking: Any = None, reference: Reference | None = None,
                  store: Any = None, temperature: float = settings.TEMPERATURE, top_p: float = settings.TOP_P,
                  seed: int = settings.SEED, max_new_tokens: int = settings.MAX_NEW_TOKENS,
                  batch_size: int = settings.BATCH_SIZE, progress: StageProgress | None = None,
                  keep: dict[str, Any] | None = None, executor: Any = None) -> pd.DataFrame:
    """The shoot-out table (GATE_COLUMNS), one row per benchmark x gate x target ρ, plus the base and the
    reference rows (gate "base" / "reason" / "thinking"). Each gate's knob is set by equal-ρ calibration on
    base rollouts of `calibration` (held out from `problems`); "router" needs `router` (a trained router's
    folder) and is left out without one. `params`: extra parameters per gate (e.g. {"guided": {"window": 8}}).
    With `keep`, traces are collected by label.

    Costs per generated token: `reason_evals_per_token` is the positions where decoding needs the reasoner by the
    policy's rule (a lazy gate: where it fired; others: every position); `reason_forwards_per_token` is counted:
    the reasoner's backbone forwards of one row (a call over B rows is B) seen by a hook while the stage decoded
    here, over the tokens made here (NaN when nothing was made here: read from the store, or decoded on an
    executor's workers). `wall_s_per_token` is the decoding seconds each trace records (meta["timings"]: its
    batch's wall time over its rows), so it is read back from stored traces too."""
    require_gold(problems)
    ratios = [float(r) for r in ratios]
    bad = [r for r in ratios if not 0.0 < r < 1.0]
    if bad or not ratios:
        raise InvalidInputError(f"ratios (target takeover rates) must be in (0, 1), got {list(ratios)!r}")
    gates = [g for g in gates if g != "router" or router is not None]
    for g in gates:
        if policy_spec(g).cls.knob is None:
            raise InvalidInputError(f"{g!r} has no knob to set at equal ρ; the gates: {', '.join(GATES)}")
    if not calibration:
        raise InvalidInputError("compare_gates needs calibration problems (held out from the evaluated ones)")
    params = {g: dict(v) for g, v in (params or {}).items()}
    if router is not None:
        params.setdefault("router", {})["path"] = str(router)
    common = dict(samples=samples, store=store, temperature=temperature, top_p=top_p, seed=seed,
                  max_new_tokens=max_new_tokens, batch_size=batch_size, executor=executor)
    # without a store the traces are held (a small run), so that the timings they record can be read
    keep = {} if keep is None and store is None else keep
    reference = reference if reference is not None else (THINKING if thinking is not None else GUIDE)
    watch = getattr(pair, "reason", None) if executor is None else None
    watch = watch if hasattr(watch, "get_decoder") else None

    def bar(stage: str) -> Progress | None:
        return None if progress is None else (lambda done, total: progress(stage, done, total))

    rollouts = list(calibration_rollouts(pair, calibration, keep=keep, progress=bar("calibration rollouts"),
                                         **common))
    counts: dict[str, tuple[ForwardCount | None, set[str]]] = {}  # label -> (forwards, keys stored before)

    def stage(policies: dict[str, Any], name: str, into: RecordTable) -> None:
        """One stage of the run, its reasoner forwards counted (per stage: every label in it shares the count)."""
        before = set(store.keys()) if store is not None and hasattr(store, "keys") else set()
        with count_forwards(watch) if watch is not None else nullcontext() as seen:
            stream_records(pair, problems, policies, keep=keep, into=into, progress=bar(name), **common)
        for label in policies:
            counts[label] = (seen, before)

    runs: dict[str, tuple[Any, float, float]] = {}
    with RecordTable() as records:
        stage({BASE: BaseOnly()}, "base", records)
        stage({GUIDE: ReasonOnly()}, "reference", records)
        if thinking is not None:
            held: dict[str, Any] = {}
            stream_records(thinking, problems, {THINKING: Solo()}, keep=held, into=records,
                           progress=bar("thinking"), **common)
            if keep is not None:
                keep_traces(keep, THINKING, held.get(THINKING, []), store)
        for rho in ratios:
            for gate in gates:
                label = gate_label(gate, rho)
                policy = build_policy(pair, gate, params.get(gate), rho=rho, rollouts=rollouts,
                                      max_new_tokens=max_new_tokens)
                stage({label: policy}, label, records)
                runs[label] = (policy, rho, rollout_rho(policy, rollouts, pair))
        frame = records.frame()
        table = policy_table(records, base=BASE, reference=reference)
    seconds = _decode_seconds(frame, store, keep)
    rows: list[dict[str, Any]] = []
    for _, row in table.iterrows():
        label = str(row["policy"])
        part = frame[(frame["benchmark"] == row["benchmark"]) & (frame["policy"] == label)]
        flip = flips(frame[frame["benchmark"] == row["benchmark"]], label)
        up, down = ((int(flip["wrong_to_right"].sum()), int(flip["right_to_wrong"].sum())) if len(flip) else (0, 0))
        entry = {**row.to_dict(), "label": label, "wrong_to_right": up, "right_to_wrong": down,
                 "wall_s_per_token": _per_token(part, seconds),
                 "reason_forwards_per_token": _forwards_per_token(frame[frame["policy"] == label], *counts.get(
                     label, (None, set())))}
        if label in runs:
            policy, rho, calibrated = runs[label]
            knob = str(type(policy).knob)
            entry.update(gate=policy.name, target_rho=rho, calibrated_rho=calibrated, knob=knob,
                         knob_value=_knob(policy, knob), reason_evals_per_token=reason_evals_per_token(policy, part))
        else:
            entry.update(gate=label, target_rho=math.nan, calibrated_rho=math.nan, knob=None, knob_value=math.nan,
                         reason_evals_per_token=1.0 if label != BASE else 0.0)
            if label == BASE:
                entry.update(wrong_to_right=0, right_to_wrong=0)
        rows.append(entry)
    out = pd.DataFrame(rows)
    return out[[c for c in GATE_COLUMNS if c in out.columns]]


def _decode_seconds(frame: pd.DataFrame, store: Any, keep: Mapping[str, Any] | None) -> dict[str, float | None]:
    """key -> the decoding seconds its trace records (`decode_seconds`): from the store's summaries (a trace file is
    read only when its summary predates them), else from the traces held in `keep`."""
    if store is not None and hasattr(store, "summary"):
        out = {k: (store.summary(k) or {}).get("decode_s") for k in frame["key"].unique()}
        for k in [k for k, v in out.items() if v is None and k in store]:  # stored before summaries carried it
            out[k] = decode_seconds(store.get(k).meta)
        return out
    return {t.key: decode_seconds(t.meta) for traces in (keep or {}).values() if isinstance(traces, list)
            for t in traces}


def _per_token(part: pd.DataFrame, seconds: Mapping[str, float | None]) -> float:
    """Decoding seconds per token of these records (NaN when a trace recorded none, or there are no tokens)."""
    values = [seconds.get(k) for k in part["key"]]
    tokens = float(part["tokens"].sum())
    if not tokens or any(v is None or not math.isfinite(v) for v in values):
        return math.nan
    return float(sum(values)) / tokens  # type: ignore[arg-type]


def _forwards_per_token(part: pd.DataFrame, seen: ForwardCount | None, before: set[str]) -> float:
    """The counted reasoner row-forwards of a stage over the tokens it made here (every benchmark: the count is
    per stage); NaN when none were counted or none made here."""
    if seen is None:
        return math.nan
    tokens = float(part.loc[~part["key"].isin(before), "tokens"].sum())
    return seen.rows / tokens if tokens else math.nan


def _knob(policy: Any, knob: str) -> float:
    """The calibrated value of a gate's knob (Guided: its τ; λ is in its record)."""
    value = getattr(policy, knob, math.nan)
    return float(value) if isinstance(value, (int, float, np.floating)) and value is not None else math.nan


def gate_summary(table: pd.DataFrame) -> pd.DataFrame:
    """The shoot-out averaged over benchmarks (or the only one): one row per gate and target ρ, flips summed;
    recovery recomputed from the averages (as the paper's table does)."""
    if table.empty:
        return table
    if table["benchmark"].nunique() == 1:
        return table.reset_index(drop=True)
    sums = ["wrong_to_right", "right_to_wrong", "problems"]
    means = ["calibrated_rho", "rho", "accuracy", "pass@k", "reason_evals_per_token", "reason_forwards_per_token",
             "wall_s_per_token",
             "mean_tokens", "knob_value"]
    keys = ["label", "gate", "target_rho", "knob"]
    g = table.fillna({"target_rho": -1.0, "knob": ""}).groupby(keys, sort=False)
    avg = g[means].mean().join(g[sums].sum()).join(g[["k", "samples"]].min()).reset_index()
    avg = avg.replace({"target_rho": {-1.0: math.nan}, "knob": {"": None}}).assign(benchmark="average")
    ends = avg[avg["label"].isin([BASE, GUIDE, THINKING])].rename(columns={"label": "policy"})
    ref = str(table["reference"].iloc[0]).removeprefix("policy ").removesuffix(" (missing)")
    avg = add_recovery(avg.rename(columns={"label": "policy"}), base=BASE, reference=ref, ends=ends)
    return avg.rename(columns={"policy": "label"})[[c for c in GATE_COLUMNS if c in table.columns]]


def write_gates(out: str | Path, table: pd.DataFrame, info: Mapping[str, Any] | None = None) -> dict[str, Path]:
    """Write `out`/gates.csv (every benchmark and the average) and `out`/gates.html (the table and its Pareto
    plots, self-contained); returns {"csv": path, "html": path}."""
    from core.reports.gates_report import gates_html  # plotly

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = gate_summary(table)
    full = table if summary is table or set(summary["benchmark"]) <= set(table["benchmark"]) else pd.concat(
        [table, summary], ignore_index=True)
    write_csv(full, out / "gates.csv")
    html = gates_html(str(out / "gates.html"), summary, table, dict(info or {}))
    return {"csv": out / "gates.csv", "html": Path(html)}


def read_gates(path: str | Path) -> pd.DataFrame:
    """A shoot-out table written by `write_gates` (its gates.csv, or the folder holding it): the average rows
    when there are several benchmarks, else the only benchmark's. InvalidInputError naming the file otherwise."""
    file = Path(path)
    file = file / "gates.csv" if file.is_dir() else file
    try:
        table = pd.read_csv(file)
    except (OSError, ValueError) as err:
        raise InvalidInputError(f"cannot read a gate shoot-out table from {file}: {err}") from err
    missing = {"benchmark", "label", "gate", "rho", "accuracy"} - set(table.columns)
    if missing:
        raise InvalidInputError(f"{file} is not a gates.csv (no column {', '.join(sorted(missing))}); make one with "
                                "`forkpoint gates --out DIR`")
    return table[table["benchmark"] == "average"].reset_index(drop=True) if (table["benchmark"] == "average").any() \
        else table
