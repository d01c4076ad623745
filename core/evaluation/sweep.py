"""Recovery against the realised takeover rate ρ: Guided calibrated at each ratio r (and each budget cap),
with the random-position and early-prefix baselines matched to the ρ Guided *realised* on each benchmark.

The gate is fitted once per ratio on base rollouts of held-out calibration problems (the paper's
offline calibration), sampled like the evaluation itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from core import settings
from core.annotate.spikes import Gate, calibrate_gate
from core.decoding.policies import (
    BaseOnly,
    EarlyOnly,
    RandomPositions,
    ReasonOnly,
    make_policy,
)
from core.errors import InvalidInputError
from core.evaluation.harness import (
    BASE,
    GUIDE,
    THINKING,
    Reference,
    add_recovery,
    benchmarks_of,
    early_rate_for,
    keep_traces,
    policy_table,
    require_gold,
    run_records,
    thinking_records,
)
from core.scoring.registry import score_values
from core.settings import StageProgress

log = logging.getLogger(__name__)

DEFAULT_RATIOS = settings.RATIOS  # the sweep's r values (core/settings.py)
SWEEP_COLUMNS = ("config", "ratio", "budget", "matched_rho", "tau", "lam", "window")


def config_label(ratio: float, budget: float | None) -> str:
    """"r=0.05" or "r=0.05 cap=0.1": one Guided configuration of the sweep."""
    return f"r={ratio:g}" + ("" if budget is None else f" cap={budget:g}")


def calibration_gates(pair: Any, calibration: Sequence[Any], ratios: Sequence[float], *, window: int,
                      score: str = settings.SCORE, keep: dict[str, list[Any]] | None = None,
                      progress: Callable[[int, int], None] | None = None, **common: Any) -> dict[float, Gate]:
    """{ratio: Gate} fitted on base rollouts of `calibration` (one sample each, stored and reused)."""
    if not calibration:
        raise InvalidInputError("the sweep needs calibration problems (held out from the evaluation set)")
    held: dict[str, Any] = {}
    run_records(pair, {"calibration": list(calibration)}, {"calibration": BaseOnly()},
                **{**common, "samples": 1}, keep=held, progress=progress)
    if keep is not None:
        keep_traces(keep, "calibration", held["calibration"], common.get("store"))
    scores = [np.asarray(score_values(t.metrics, score)) for t in held["calibration"]]  # read one at a time
    return {r: calibrate_gate(scores, r, window) for r in ratios}


def _realised(records: pd.DataFrame) -> tuple[float, float]:
    """(ρ = takeovers / tokens, mean tokens) of a run's records."""
    tokens = int(records["tokens"].sum())
    return int(records["taken"].sum()) / max(1, tokens), tokens / max(1, len(records))


def budget_sweep(pair: Any, problems: Any, calibration: Sequence[Any], ratios: Sequence[float] = DEFAULT_RATIOS, *,
                 budgets: Sequence[float | None] = (None,), window: int = settings.WINDOW,
                 score: str = settings.SCORE, baselines: bool = True, thinking: Any = None,
                 reference: Reference | None = None, samples: int = settings.SAMPLES, store: Any = None,
                 temperature: float = settings.TEMPERATURE, top_p: float = settings.TOP_P, seed: int = settings.SEED,
                 max_new_tokens: int = settings.MAX_NEW_TOKENS, batch_size: int = settings.BATCH_SIZE,
                 progress: StageProgress | None = None, keep: dict[str, list[Any]] | None = None,
                 executor: Any = None) -> pd.DataFrame:
    """One row per benchmark and policy configuration: the ends (base, guide "reason", and "thinking"
    when a thinking pair is given), Guided at each (ratio r, budget cap; None = no cap, the paper's gate),
    and RandomPositions / EarlyOnly at the ρ that Guided realised on that benchmark ("matched_rho").
    Columns: POLICY_TABLE_COLUMNS + SWEEP_COLUMNS. Recovery is against `reference` (default "thinking"
    when given, else the guide). With `keep`, traces are collected by config label ("base", ...).
    `executor` (e.g. `core.RayExecutor()`) makes every trace; gates are fit and tables built here."""
    require_gold(problems)
    if not calibration:  # checked before any generation
        raise InvalidInputError("the sweep needs calibration problems (held out from the evaluation set)")
    common = dict(samples=samples, store=store, temperature=temperature, top_p=top_p, seed=seed,
                  max_new_tokens=max_new_tokens, batch_size=batch_size, executor=executor)
    keep = {} if keep is None else keep
    reference = reference if reference is not None else (THINKING if thinking is not None else GUIDE)
    if reference == GUIDE:
        log.warning("recovery is measured against the guide, not the same-size thinking model the paper uses")

    def bar(stage: str) -> Callable[[int, int], None] | None:
        return None if progress is None else (lambda done, total: progress(stage, done, total))

    records = run_records(pair, problems, {BASE: BaseOnly(), GUIDE: ReasonOnly()}, keep=keep,
                          progress=bar("base and guide"), **common)
    if thinking is not None:
        held: dict[str, Any] = {}
        records = pd.concat([records, thinking_records(thinking, problems, keep=held, progress=bar("thinking"),
                                                       **common)], ignore_index=True)
        keep_traces(keep, THINKING, held.get(THINKING, []), store)
    ends = policy_table(records)
    rows = [ends.assign(config=ends["policy"])]
    gates = calibration_gates(pair, calibration, ratios, window=window, score=score, keep=keep,
                              progress=bar("calibration rollouts"), **common)
    for ratio in ratios:
        for budget in budgets:
            rows += _one_config(pair, problems, gates[ratio], ratio, budget, score=score, baselines=baselines,
                                keep=keep, bar=bar, common=common)
    table = pd.concat(rows, ignore_index=True)
    table = add_recovery(table.drop(columns=["recovery", "recovery@k", "reference"]), base=BASE,
                         reference=reference, ends=ends)
    return table


def _one_config(pair: Any, problems: Any, gate: Gate, ratio: float, budget: float | None, *, score: str,
                baselines: bool, keep: dict[str, list[Any]],
                bar: Callable[[str], Callable[[int, int], None] | None], common: dict[str, Any]) -> list[pd.DataFrame]:
    """Policy-table rows of one Guided configuration and, per benchmark, its ρ-matched baselines."""
    label = config_label(ratio, budget)
    guided = make_policy("guided", gate=gate, budget=budget, score=score)
    held: dict[str, Any] = {}
    store = common.get("store")
    found = []
    for bench, ps in benchmarks_of(problems).items():
        got: dict[str, Any] = {}
        rec = run_records(pair, {bench: ps}, {"guided": guided}, keep=got, progress=bar(f"guided {label} ({bench})"),
                          **common)
        extra = {"config": label, "ratio": ratio, "budget": budget, "matched_rho": np.nan, "tau": gate.tau,
                 "lam": gate.lam, "window": gate.window}
        found.append(policy_table(rec).assign(**extra))
        keep_traces(held, label, got["guided"], store)
        rho, mean_tokens = _realised(rec)
        if not baselines or rho <= 0:
            continue
        others = {"random_positions": RandomPositions(rate=min(1.0, rho), seed=common.get("seed", 0)),
                  "early_only": EarlyOnly(rate=early_rate_for(rho, mean_tokens, common["max_new_tokens"]))}
        got = {}
        rec = run_records(pair, {bench: ps}, others, keep=got, progress=bar(f"baselines at ρ of {label} ({bench})"),
                          **common)
        found.append(policy_table(rec).assign(**{**extra, "matched_rho": rho}))
        for name, traces in got.items():
            keep_traces(held, f"{name} ({label})", traces, store)
    for name, traces in held.items():
        keep_traces(keep, name, traces, store)
    return found
