"""Failure prediction (the paper's AUROC): one statistic per response from its scores predicts a wrong
answer; AUROC by ranks (ties averaged), ROC points, for the chosen score and for base entropy."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from core.analysis.views import ENTROPY, POOLED, SEGMENTS  # noqa: F401
from core.analysis.views import as_list as _as_list  # noqa: F401
from core.analysis.views import prepare as _prepare
from core.analysis.views import values as _values  # noqa: F401
from core.errors import InvalidInputError
from core.scoring.registry import DEFAULT_SCORE
from core.trace import Trace

_STAT_RE = re.compile(r"^top(\d+)_mean$")


def trace_stat(values: np.ndarray, stat: str = "top100_mean") -> float:
    """One number per response: "top<k>_mean" (mean of the k largest scores, all if fewer), "max", "mean"."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    v = v[~np.isnan(v)]
    m = _STAT_RE.match(stat)
    if not (m or stat in ("max", "mean")) or (m and int(m.group(1)) < 1):
        raise InvalidInputError(f"Unknown stat {stat!r}; choose one of: top<k>_mean (e.g. top100_mean), max, mean")
    if v.size == 0:
        return float("nan")
    if stat == "max":
        return float(v.max())
    if stat == "mean":
        return float(v.mean())
    k = min(int(m.group(1)), v.size)  # type: ignore[union-attr]
    return float(np.sort(v)[::-1][:k].mean())


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of `x`, ties sharing the average of their ranks."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    return (upper - (counts - 1) / 2.0)[inverse]


def auroc(scores: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray) -> float:
    """Area under the ROC curve: P(score_pos > score_neg) + P(tie) / 2 (Mann-Whitney U). NaN if one class."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=bool).reshape(-1)
    if s.size != y.size:
        raise InvalidInputError(f"auroc got {s.size} scores for {y.size} labels")
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = _average_ranks(s)
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def roc_points(
    scores: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ROC curve (fpr, tpr, threshold), from (0, 0) at +inf to (1, 1); predict positive iff score >= threshold."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=bool).reshape(-1)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    thresholds = np.unique(s)[::-1]
    tp = np.array([(y & (s >= th)).sum() for th in thresholds], dtype=np.float64)
    fp = np.array([(~y & (s >= th)).sum() for th in thresholds], dtype=np.float64)
    tpr = np.concatenate([[0.0], tp / n_pos if n_pos else np.full(tp.size, np.nan)])
    fpr = np.concatenate([[0.0], fp / n_neg if n_neg else np.full(fp.size, np.nan)])
    return fpr, tpr, np.concatenate([[np.inf], thresholds])


def _failure_data(traces: list[Trace], stat: str, signal: str, segment: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(per-trace statistic, is-wrong label) over traces whose correctness is known."""
    stats, labels = [], []
    for t in traces:
        correct = t.meta.get("correct")
        if correct is None:
            continue
        value = trace_stat(_values(t, signal, segment)[1], stat)
        if math.isnan(value):
            continue
        stats.append(value)
        labels.append(not bool(correct))
    return np.asarray(stats, dtype=np.float64), np.asarray(labels, dtype=bool)


def _signals(score: str) -> list[str]:
    return [score] if score == ENTROPY else [score, ENTROPY]


def failure_auroc(
    traces: Trace | Sequence[Trace], stat: str = "top100_mean", score: str = DEFAULT_SCORE, segment: str | None = None
) -> pd.DataFrame:
    """How well a per-response statistic predicts a WRONG answer, for `score` and for base entropy.

    Columns signal, stat, auroc, n_pos (wrong), n_neg (right), note. Traces with meta["correct"] None
    (or no tokens) are left out; with only one class the AUROC is NaN and `note` says why.
    """
    items = _prepare(traces, score, segment)
    trace_stat(np.zeros(0), stat)  # validate the name early
    rows = []
    for signal in _signals(score):
        x, y = _failure_data(items, stat, signal, segment)
        n_pos, n_neg = int(y.sum()), int((~y).sum())
        note = ""
        if n_pos == 0 or n_neg == 0:
            note = f"AUROC undefined: {n_pos} wrong and {n_neg} right answers among traces with known correctness"
        rows.append({"signal": signal, "stat": stat, "auroc": auroc(x, y), "n_pos": n_pos, "n_neg": n_neg, "note": note})
    return pd.DataFrame(rows, columns=["signal", "stat", "auroc", "n_pos", "n_neg", "note"])


def roc_curve(
    traces: Trace | Sequence[Trace], stat: str = "top100_mean", score: str = DEFAULT_SCORE, segment: str | None = None
) -> pd.DataFrame:
    """ROC points of the failure predictor for `score` and base entropy: columns signal, fpr, tpr, threshold."""
    items = _prepare(traces, score, segment)
    trace_stat(np.zeros(0), stat)
    frames = []
    for signal in _signals(score):
        x, y = _failure_data(items, stat, signal, segment)
        if y.all() or not y.any():
            continue
        fpr, tpr, th = roc_points(x, y)
        frames.append(pd.DataFrame({"signal": signal, "fpr": fpr, "tpr": tpr, "threshold": th}))
    cols = ["signal", "fpr", "tpr", "threshold"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)
