"""Recovery against the realised takeover rate ρ: Guided calibrated at each ratio r (and each budget cap),
the cheap entropy-gated variant at the same r, and the random-position and early-prefix baselines at
each `baseline_rhos` ρ: the ρ Guided *realised* on each benchmark ("realised") and fixed rates such as
the paper's 0.25. `matched_baselines` is the one builder of those baselines (the demo card uses it too).

The gates are fitted once per ratio on base rollouts of held-out calibration problems (the paper's
offline calibration), sampled like the evaluation itself.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from core import settings
from core.annotate.spikes import Gate, calibrate_gate
from core.decoding.calibration import rollout_store
from core.decoding.policies import (
    BaseOnly,
    EarlyOnly,
    Policy,
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
    stream_records,
)
from core.evaluation.thinking import Solo
from core.scoring.registry import score_values
from core.settings import Progress, StageProgress

log = logging.getLogger(__name__)

ENTROPY_SIGNAL = "entropy_base"  # the entropy-gated variant's signal

DEFAULT_RATIOS = settings.RATIOS  # the sweep's r values (core/settings.py)
REALISED = "realised"  # a baseline ρ: the one Guided realised on the benchmark
PAPER_BASELINE_RHO = 0.25  # the paper's random and early-only baselines
DEFAULT_BASELINE_RHOS: tuple[str | float, ...] = (REALISED, PAPER_BASELINE_RHO)
SWEEP_COLUMNS = ("config", "ratio", "budget", "matched_rho", "tau", "lam", "window", "threshold")


def check_baseline_rhos(rhos: Sequence[str | float]) -> list[str | float]:
    """`rhos` as a list of "realised" and rates in (0, 1]; raise naming the bad value."""
    out: list[str | float] = []
    for rho in rhos:
        if isinstance(rho, str) and rho.strip().lower() in (REALISED, "realized", "matched"):
            out.append(REALISED)
            continue
        try:
            value = float(rho)
        except (TypeError, ValueError):
            value = float("nan")
        if not 0.0 < value <= 1.0:
            raise InvalidInputError(f"baseline_rho must be 'realised' or a rate in (0, 1], got {rho!r}")
        out.append(value)
    return list(dict.fromkeys(out))


def fixed_label(rho: float) -> str:
    """"ρ=0.25": the config of baselines run at a fixed rate."""
    return f"ρ={rho:g}"


def matched_baselines(rho: float, mean_tokens: float, max_new_tokens: int, seed: int,
                      suffix: str = "", exact: bool = False) -> dict[str, Policy]:
    """RandomPositions and EarlyOnly at takeover rate `rho` on responses of about `mean_tokens` tokens
    ({"random_positions" + suffix: ..., "early_only" + suffix: ...}): the one builder of ρ-matched baselines.

    `exact` (the sweep's): EarlyOnly's prefix is dithered per row so that its mean is rho · mean_tokens (not
    rounded to a whole token, which at ρ ≈ 0.008 doubled it), and each ρ draws its own random positions (a
    seed of its own), so that the rows of several ratios do not share one set of draws. Without it, the
    demo card's rule (its numbers were measured so)."""
    if not exact:
        return {f"random_positions{suffix}": RandomPositions(rate=min(1.0, rho), seed=seed),
                f"early_only{suffix}": EarlyOnly(rate=early_rate_for(rho, mean_tokens, max_new_tokens))}
    own = baseline_seed(seed, rho)
    return {f"random_positions{suffix}": RandomPositions(rate=min(1.0, rho), seed=own),
            f"early_only{suffix}": EarlyOnly(rate=min(1.0, rho * mean_tokens / max_new_tokens), seed=own)}


def baseline_seed(seed: int, rho: float) -> int:
    """A seed of its own for the baselines at `rho` (stable: from the seed and the rate's digits)."""
    digest = hashlib.blake2b(f"{int(seed)}:{float(rho)!r}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def config_label(ratio: float, budget: float | None) -> str:
    """"r=0.05" or "r=0.05 cap=0.1": one Guided configuration of the sweep."""
    return f"r={ratio:g}" + ("" if budget is None else f" cap={budget:g}")


def calibration_rollouts(pair: Any, calibration: Sequence[Any], *, keep: dict[str, list[Any]] | None = None,
                         progress: Progress | None = None, **common: Any) -> list[Any]:
    """Base rollouts of `calibration` (one sample each, stored and reused in the store's calibration store,
    apart from the evaluation's traces); kept under "calibration"."""
    if not calibration:
        raise InvalidInputError("the sweep needs calibration problems (held out from the evaluation set)")
    held: dict[str, Any] = {}
    store = rollout_store(common.get("store"))
    with stream_records(pair, {"calibration": list(calibration)}, {"calibration": BaseOnly()},
                        **{**common, "samples": 1, "store": store}, keep=held, progress=progress):
        pass  # only the kept rollouts are needed
    if keep is not None:
        keep_traces(keep, "calibration", held["calibration"], store)
    return held["calibration"]  # with a store, keys read back one trace at a time


def fit_gates(rollouts: Sequence[Any], ratios: Sequence[float], window: int, score: str) -> dict[float, Gate]:
    """{ratio: Gate} fitted on the `score` values of `rollouts` (with "entropy_base", τ is the entropy-gated
    variant's threshold: the (1 - r) quantile of the base's entropy)."""
    scores = [np.asarray(score_values(t.metrics, score)) for t in rollouts]  # read one at a time
    return {r: calibrate_gate(scores, r, window) for r in ratios}


def calibration_gates(pair: Any, calibration: Sequence[Any], ratios: Sequence[float], *, window: int,
                      score: str = settings.SCORE, keep: dict[str, list[Any]] | None = None,
                      progress: Progress | None = None, **common: Any) -> dict[float, Gate]:
    """{ratio: Gate} fitted on base rollouts of `calibration` (one sample each, stored and reused)."""
    rollouts = calibration_rollouts(pair, calibration, keep=keep, progress=progress, **common)
    return fit_gates(rollouts, ratios, window, score)


def stage_table(pair: Any, problems: Any, policies: dict[str, Policy], **opts: Any) -> pd.DataFrame:
    """The policy table of one stage: its records go through an on-disk `RecordTable` (as `evaluate`'s do),
    aggregated there and dropped, so no stage holds a DataFrame of its rows."""
    with stream_records(pair, problems, policies, **opts) as records:
        return policy_table(records)


def budget_sweep(pair: Any, problems: Any, calibration: Sequence[Any], ratios: Sequence[float] = DEFAULT_RATIOS, *,
                 budgets: Sequence[float | None] = (None,), window: int = settings.WINDOW,
                 score: str = settings.SCORE, baselines: bool = True, thinking: Any = None,
                 baseline_rhos: Sequence[str | float] = DEFAULT_BASELINE_RHOS, entropy_gated: bool = True,
                 skip_first: int = 0,
                 reference: Reference | None = None, samples: int = settings.SAMPLES, store: Any = None,
                 temperature: float = settings.TEMPERATURE, top_p: float = settings.TOP_P, seed: int = settings.SEED,
                 max_new_tokens: int = settings.MAX_NEW_TOKENS, batch_size: int = settings.BATCH_SIZE,
                 progress: StageProgress | None = None, keep: dict[str, list[Any]] | None = None,
                 executor: Any = None) -> pd.DataFrame:
    """One row per benchmark and policy configuration: the ends (base, guide "reason", and "thinking"
    when a thinking pair is given), Guided at each (ratio r, budget cap; None = no cap, the paper's gate),
    with `entropy_gated` the entropy-gated variant at the same (r, cap) (its threshold the (1 - r) quantile
    of the calibration rollouts' base entropy), and RandomPositions / EarlyOnly at each `baseline_rhos`
    ρ ("matched_rho"): "realised" = the ρ Guided realised on that benchmark (config "r=..."), a number =
    that fixed rate (config "ρ=0.25", run once per benchmark, prefix length from the base's mean length).
    `skip_first` (the gates' first-k-positions skip) goes to Guided and the entropy-gated variant.
    Columns: POLICY_TABLE_COLUMNS + SWEEP_COLUMNS. Recovery is against `reference` (default "thinking"
    when given, else the guide). With `keep`, traces are collected by config label ("base", ...).
    `executor` (e.g. `core.RayExecutor()`) makes every trace; gates are fit and tables built here."""
    require_gold(problems)
    baseline_rhos = check_baseline_rhos(baseline_rhos) if baselines else []
    if not calibration:  # checked before any generation
        raise InvalidInputError("the sweep needs calibration problems (held out from the evaluation set)")
    common = dict(samples=samples, store=store, temperature=temperature, top_p=top_p, seed=seed,
                  max_new_tokens=max_new_tokens, batch_size=batch_size, executor=executor)
    keep = {} if keep is None else keep
    reference = reference if reference is not None else (THINKING if thinking is not None else GUIDE)
    if reference == GUIDE:
        log.warning("recovery is measured against the guide, not the same-size thinking model the paper uses")

    def bar(stage: str) -> Progress | None:
        return None if progress is None else (lambda done, total: progress(stage, done, total))

    with stream_records(pair, problems, {BASE: BaseOnly(), GUIDE: ReasonOnly()}, keep=keep,
                        progress=bar("base and guide"), **common) as records:
        if thinking is not None:
            held: dict[str, Any] = {}
            stream_records(thinking, problems, {THINKING: Solo()}, keep=held, progress=bar("thinking"),
                           into=records, **common)
            keep_traces(keep, THINKING, held.get(THINKING, []), store)
        ends = policy_table(records)
    rows = [ends.assign(config=ends["policy"])]
    rollouts = calibration_rollouts(pair, calibration, keep=keep, progress=bar("calibration rollouts"), **common)
    gates = fit_gates(rollouts, ratios, window, score)
    thresholds = ({r: g.tau for r, g in fit_gates(rollouts, ratios, window, ENTROPY_SIGNAL).items()}
                  if entropy_gated else {})
    for ratio in ratios:
        for budget in budgets:
            rows += _one_config(pair, problems, gates[ratio], ratio, budget, score=score,
                                baselines=REALISED in baseline_rhos, keep=keep, bar=bar, common=common,
                                threshold=thresholds.get(ratio), skip_first=skip_first)
    fixed = [r for r in baseline_rhos if r != REALISED]
    if fixed:
        rows += _fixed_baselines(pair, problems, fixed, ends, keep=keep, bar=bar, common=common)
    table = pd.concat(rows, ignore_index=True)
    table = add_recovery(table.drop(columns=["recovery", "recovery@k", "reference"]), base=BASE,
                         reference=reference, ends=ends)
    return table


def _fixed_baselines(pair: Any, problems: Any, rhos: Sequence[float], ends: pd.DataFrame, *,
                     keep: dict[str, list[Any]], bar: Callable[[str], Progress | None],
                     common: dict[str, Any]) -> list[pd.DataFrame]:
    """Policy-table rows of the baselines at fixed rates (config "ρ=0.25"), per benchmark; EarlyOnly's
    prefix is sized on the base's mean response length there."""
    found = []
    for bench, ps in benchmarks_of(problems).items():
        base = ends[(ends["benchmark"] == bench) & (ends["policy"] == BASE)]
        mean_tokens = float(base["mean_tokens"].iloc[0]) if len(base) else float(common["max_new_tokens"])
        for rho in rhos:
            label = fixed_label(rho)
            got: dict[str, list[Any]] = {}
            others = matched_baselines(rho, mean_tokens, common["max_new_tokens"], common.get("seed", 0), exact=True)
            rec = stage_table(pair, {bench: ps}, others, keep=got, progress=bar(f"baselines at {label} ({bench})"),
                              **common)
            found.append(rec.assign(config=label, ratio=np.nan, budget=None, matched_rho=rho,
                                                  tau=np.nan, lam=np.nan, window=np.nan, threshold=np.nan))
            for name, traces in got.items():
                keep_traces(keep, f"{name} ({label})", traces, common.get("store"))
    return found


def _one_config(pair: Any, problems: Any, gate: Gate, ratio: float, budget: float | None, *, score: str,
                baselines: bool, keep: dict[str, list[Any]],
                bar: Callable[[str], Progress | None], common: dict[str, Any],
                threshold: float | None = None, skip_first: int = 0) -> list[pd.DataFrame]:
    """Policy-table rows of one Guided configuration, its entropy-gated twin (with a `threshold`) and, per
    benchmark, the baselines matched to Guided's realised ρ."""
    label = config_label(ratio, budget)
    policies = {"guided": make_policy("guided", gate=gate, budget=budget, score=score, skip_first=skip_first)}
    if threshold is not None:
        policies["entropy_gated"] = make_policy("entropy_gated", threshold=max(0.0, threshold), budget=budget,
                                                skip_first=skip_first)
    held: dict[str, Any] = {}
    store = common.get("store")
    found = []
    for bench, ps in benchmarks_of(problems).items():
        got: dict[str, Any] = {}
        stage = stage_table(pair, {bench: ps}, policies, keep=got, progress=bar(f"guided {label} ({bench})"),
                            **common)
        extra = {"config": label, "ratio": ratio, "budget": budget, "matched_rho": np.nan, "tau": gate.tau,
                 "lam": gate.lam, "window": gate.window, "threshold": np.nan}
        table = stage.assign(**extra)
        table.loc[table["policy"] == "entropy_gated", ["tau", "lam", "window", "threshold"]] = (
            np.nan, np.nan, np.nan, threshold if threshold is not None else np.nan)
        found.append(table)
        keep_traces(held, label, got["guided"], store)
        if "entropy_gated" in got:
            keep_traces(held, f"entropy_gated ({label})", got["entropy_gated"], store)
        guided = stage[stage["policy"] == "guided"].iloc[0]  # ρ = takeovers / tokens, mean tokens per row
        rho, mean_tokens = float(guided["rho"]), float(guided["mean_tokens"])
        if not baselines or rho <= 0:
            continue
        others = matched_baselines(rho, mean_tokens, common["max_new_tokens"], common.get("seed", 0), exact=True)
        got = {}
        rec = stage_table(pair, {bench: ps}, others, keep=got, progress=bar(f"baselines at ρ of {label} ({bench})"),
                          **common)
        found.append(rec.assign(**{**extra, "matched_rho": rho}))
        for name, traces in got.items():
            keep_traces(held, f"{name} ({label})", traces, store)
    for name, traces in held.items():
        keep_traces(keep, name, traces, store)
    return found
