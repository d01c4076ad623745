"""Spikes: the positions where the two models disagree most, and the calibrated takeover gate.

Two rules, both pure:
- top-p%: the ceil(p*T) highest-scoring positions of a trace (or of a whole set of traces pooled) whose
  score is above a floor (settings.SPIKE_FLOOR nats): ties at the cut go to the earlier position, and a
  trace with fewer clearly-scored tokens gets fewer spikes rather than spikes on ~0 scores;
- the gate (from the seed paper): at step t a spike iff s_t > tau and s_t > lam * mean(s_{t-W..t-1}).
The decoding policy `Guided` reuses `Gate` and `gate_fires`, so analysis and generation agree.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np

from core import settings
from core.errors import InvalidInputError
from core.scoring.registry import DEFAULT_SCORE, check_score, score_values
from core.trace import Trace

log = logging.getLogger(__name__)

PER_CHOICES = ("trace", "dataset")


@dataclass(frozen=True)
class Gate:
    """The calibrated takeover gate: fire iff s_t > tau and s_t > lam * mean of the previous `window` scores."""

    tau: float  # absolute threshold: the (1 - r) quantile of calibration scores
    lam: float  # relative threshold: E[s | s > tau] / E[s] on the calibration scores
    window: int  # W, how many previous scores the running mean looks at (current excluded)
    ratio: float | None = field(default=None, compare=False)  # r it was calibrated at (None: set by hand)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tau) and math.isfinite(self.lam)):
            raise InvalidInputError(f"Gate tau and lam must be finite numbers, got tau={self.tau!r}, lam={self.lam!r}")
        if isinstance(self.window, bool) or int(self.window) != self.window or self.window < 1:
            raise InvalidInputError(f"Gate window must be an integer >= 1, got {self.window!r}")
        object.__setattr__(self, "window", int(self.window))
        object.__setattr__(self, "tau", float(self.tau))
        object.__setattr__(self, "lam", float(self.lam))

    def to_dict(self) -> dict[str, float | int]:
        """Plain-JSON form, as recorded in a trace's spike rule or policy params (the thresholds, not `ratio`)."""
        return {"tau": self.tau, "lam": self.lam, "window": self.window}


# -- the gate -----------------------------------------------------------------------------------


def gate_fires(history: Sequence[float], s: float, gate: Gate) -> bool:
    """Whether the gate fires at a step with score `s`, given all earlier scores of the response.

    The running mean is over the last `gate.window` entries of `history` (fewer at the start of a
    response: the mean of what there is). With an empty history (t = 0) only `s > tau` is tested.
    A NaN score never fires, and a NaN inside the window blocks firing while it is in the window.
    """
    if not s > gate.tau:
        return False
    recent = history[-gate.window :] if isinstance(history, (list, tuple, np.ndarray)) else list(history)[-gate.window :]
    window = [float(x) for x in recent]
    if not window:
        return True
    acc = 0.0
    for x in window:  # plain left-to-right sum: gate_positions adds in the same order, bit for bit
        acc += x
    return bool(s > gate.lam * (acc / len(window)))


def gate_positions(scores: np.ndarray, gate: Gate) -> np.ndarray:
    """Positions (sorted int64) where the gate fires along one response: scores (T,) -> (n,).

    Gives exactly `[t for t in range(T) if gate_fires(scores[:t], scores[t], gate)]`.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    n = s.size
    w = gate.window
    fires = np.zeros(n, dtype=bool)
    head = min(n, w)  # t < W: the window is the whole (short) history; W is small, so loop
    for t in range(head):
        fires[t] = gate_fires(s[:t], s[t], gate)
    if n > w:
        # acc[i] = s[i] + s[i+1] + ... + s[i+W-1], the history of step t = i + W, summed left to
        # right exactly as `gate_fires` does (so both give the same bits, ties included).
        m = n - w
        acc = np.zeros(m, dtype=np.float64)
        for j in range(w):
            acc += s[j : j + m]
        means = acc / w  # (n - W,)
        cur = s[w:]
        fires[w:] = (cur > gate.tau) & (cur > gate.lam * means)
    return np.flatnonzero(fires).astype(np.int64)


GATE_DIGITS = 6  # significant digits of a fitted tau and lam (see gate_value)


def gate_value(x: float) -> float:
    """`x` rounded to GATE_DIGITS significant digits. A fitted tau/lam goes into the policy record, hence
    into every trace's key; scores are float32, so two drivers (or a Ray worker and this process) fit
    numbers that differ past the 8th digit (0.023175123613 vs 0.023175123334): rounded, they agree."""
    return float(f"{x:.{GATE_DIGITS}g}")


def calibrate_gate(scores_list: list[np.ndarray], ratio: float, window: int) -> Gate:
    """Fit the gate on calibration scores (e.g. base rollouts): tau = (1 - r) quantile, lam = E[s|s>tau]/E[s],
    each rounded to GATE_DIGITS significant digits (`gate_value`) so the same request gives the same key.

    Scores from all responses are pooled; NaNs are dropped; the quantile is numpy's default (linear).
    """
    if not (isinstance(ratio, (int, float)) and 0.0 < ratio < 1.0):
        raise InvalidInputError(f"ratio must be in (0, 1) (the share of tokens to take over), got {ratio!r}")
    arrays = [np.asarray(a, dtype=np.float64).reshape(-1) for a in scores_list]
    pooled = np.concatenate(arrays) if arrays else np.zeros(0)
    pooled = pooled[~np.isnan(pooled)]
    if pooled.size == 0:
        raise InvalidInputError("calibrate_gate needs at least one (non-NaN) calibration score; got none")
    tau = float(np.quantile(pooled, 1.0 - ratio))
    above = pooled[pooled > tau]
    mean = float(pooled.mean())
    if above.size == 0:
        raise InvalidInputError(
            f"no calibration score lies above the {1 - ratio:.4g} quantile ({tau:.4g}); "
            "the scores are (nearly) constant: use more calibration data or a larger ratio"
        )
    if not mean > 0:
        raise InvalidInputError(f"mean calibration score is {mean:.4g}; lam = E[s|s>tau]/E[s] needs a positive mean")
    tau, lam = gate_value(tau), gate_value(float(above.mean() / mean))
    log.info("calibrated gate on %d scores: ratio=%g window=%d -> tau=%.4g lam=%.4g", pooled.size, ratio, window, tau, lam)
    return Gate(tau=tau, lam=lam, window=window, ratio=float(ratio))


# -- top-p% -------------------------------------------------------------------------------------


def top_count(top: float, n: int) -> int:
    """How many of `n` tokens the top-`top` fraction holds: ceil(top * n), at least 1 when n > 0."""
    check_top(top)
    if n <= 0:
        return 0
    return max(1, math.ceil(round(top * n, 9)))  # round: 0.07 * 100 is 7.000000000000001


def check_top(top: float) -> float:
    """Return `top` if it is a fraction in (0, 1], else raise naming the value."""
    if isinstance(top, bool) or not isinstance(top, (int, float)) or not (0.0 < top <= 1.0):
        raise InvalidInputError(f"top must be a fraction in (0, 1] (0.01 = top 1%), got {top!r}")
    return float(top)


def top_positions(values: np.ndarray, top: float, floor: float | None = None) -> np.ndarray:
    """Sorted positions of the top-`top` fraction of `values` (T,) -> (≤ ceil(top*T),).

    Ties are broken stably by position (the earlier position wins, so exactly ceil(top*T) come back
    even when several values tie at the cut); NaN values are never chosen. With `floor`, only values
    strictly above it are eligible (a spike means disagreement: a ~0 score is never one), so fewer
    positions come back when fewer values clear it.
    """
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    eligible = ~np.isnan(v) if floor is None else (v > float(floor))
    k = min(top_count(top, v.size), int(eligible.sum()))
    order = _descending(v)
    return np.sort(order[:k]).astype(np.int64)


def _descending(v: np.ndarray) -> np.ndarray:
    """Indices of `v` from highest to lowest, ties by index, NaNs last."""
    key = np.where(np.isnan(v), np.inf, -v)
    return np.argsort(key, kind="stable")


# -- spikes as annotations ----------------------------------------------------------------------


@overload
def spikes(traces: Trace, score: str = ..., top: float | None = ..., gate: Gate | None = ..., per: str = ...,
           floor: float | None = ...) -> Trace: ...
@overload
def spikes(
    traces: Sequence[Trace], score: str = ..., top: float | None = ..., gate: Gate | None = ..., per: str = ...,
    floor: float | None = ...,
) -> list[Trace]: ...


def spikes(
    traces: Trace | Sequence[Trace],
    score: str = DEFAULT_SCORE,
    top: float | None = None,
    gate: Gate | None = None,
    per: str = "trace",
    floor: float | None = None,
) -> Trace | list[Trace]:
    """Annotate spikes: top-`top` positions by `score` (default settings.SPIKE_TOP) whose score is above `floor`
    (default settings.SPIKE_FLOOR; recorded in the rule), or where `gate` fires.

    `per="trace"` ranks within each trace; `per="dataset"` ranks the pooled scores of all the traces
    (ceil(top*N) positions over N tokens in all; ties by trace order, then position). Returns new
    trace(s) with annotations["spikes"] = {"rule": {...}, "positions": [sorted ints]}.
    """
    single = isinstance(traces, Trace)
    items: list[Trace] = [traces] if single else list(traces)  # type: ignore[list-item]
    check_score(score)
    if per not in PER_CHOICES:
        raise InvalidInputError(f"Unknown per={per!r}; choose one of: {', '.join(PER_CHOICES)}")
    if top is not None and gate is not None:
        raise InvalidInputError("give exactly one of top= (a fraction) or gate= (a Gate), not both")
    if gate is not None:
        if not isinstance(gate, Gate):
            raise InvalidInputError(f"gate must be a core.Gate, got {type(gate).__name__}")
        if per != "trace":
            raise InvalidInputError("the gate is a per-trace rule; per='dataset' only applies to top=")
        rule: dict = {"score": score, "gate": gate.to_dict()}
        positions = [gate_positions(_scores(t, score), gate) for t in items]
    else:
        top = check_top(settings.SPIKE_TOP if top is None else top)
        floor = settings.SPIKE_FLOOR if floor is None else float(floor)
        rule = {"score": score, "top": top, "per": per, "floor": floor}
        if per == "trace":
            positions = [top_positions(_scores(t, score), top, floor) for t in items]
        else:
            positions = _dataset_positions([_scores(t, score) for t in items], top, floor)
    out = [t.annotate(spikes={"rule": dict(rule), "positions": [int(p) for p in pos]}) for t, pos in zip(items, positions)]
    return out[0] if single else out


def _scores(trace: Trace, score: str) -> np.ndarray:
    return np.asarray(score_values(trace.metrics, score), dtype=np.float64).reshape(-1)


def _dataset_positions(values: list[np.ndarray], top: float, floor: float | None = None) -> list[np.ndarray]:
    """Top-`top` over the concatenation of `values` (above `floor`), split back per trace."""
    lengths = [v.size for v in values]
    pooled = np.concatenate(values) if values else np.zeros(0)
    chosen = top_positions(pooled, top, floor)
    bounds = np.cumsum([0, *lengths])
    return [chosen[(chosen >= lo) & (chosen < hi)] - lo for lo, hi in zip(bounds[:-1], bounds[1:])]


def spikes_or_top(trace: Trace, score: str = DEFAULT_SCORE, top: float = settings.SPIKE_TOP) -> np.ndarray:
    """The trace's annotated spikes (`Trace.spike_positions`) when it has a spike layer, else its top-`top`
    positions by `score` above settings.SPIKE_FLOOR (the rule `spikes` applies, so analyses count what the
    heatmap marks)."""
    if "spikes" in trace.annotations:
        return np.asarray(trace.spike_positions, dtype=np.int64)
    return top_positions(_scores(trace, score), top, settings.SPIKE_FLOOR)


__all__ = [
    "Gate",
    "PER_CHOICES",
    "calibrate_gate",
    "gate_fires",
    "gate_positions",
    "spikes_or_top",
    "spikes",
    "top_count",
    "top_positions",
]
