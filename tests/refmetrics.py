"""Brute-force float64 reference for the per-token metrics, written from the formulas in DESIGN.md.

Deliberately independent of core.divergence: plain numpy, one position at a time, no clamping, ranks by
sorting. Used by test_divergence.py and test_scoring.py.
"""

from __future__ import annotations

import numpy as np


def log_softmax(x: np.ndarray) -> np.ndarray:
    """(V,) float64 logits (may hold -inf) -> log-probabilities."""
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x)
    shifted = x - m
    return shifted - np.log(np.sum(np.exp(shifted)))


def _sum_plog(p: np.ndarray, log_ratio: np.ndarray) -> float:
    """Σ p · log_ratio with the convention 0 · anything = 0."""
    mask = p > 0
    return float(np.sum(p[mask] * log_ratio[mask]))


def rank_by_sorting(logits: np.ndarray, token: int) -> int:
    """Rank of `token` (0 = top): its index in the descending order, ties broken in its favour."""
    order = np.argsort(-np.asarray(logits, dtype=np.float64), kind="stable")
    return int(np.argmax(logits[order] == logits[token]))


def position_metrics(a: np.ndarray, b: np.ndarray, y: int | None, k: int = 10) -> dict[str, object]:
    """All metrics for one position from base logits `a` and reasoning logits `b` (both (V,))."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    la, lb = log_softmax(a), log_softmax(b)
    p, q = np.exp(la), np.exp(lb)
    m = 0.5 * (p + q)
    with np.errstate(divide="ignore"):
        lm = np.log(m)
    with np.errstate(invalid="ignore"):
        out: dict[str, object] = {
            "entropy_base": -_sum_plog(p, la),
            "entropy_reason": -_sum_plog(q, lb),
            "kl_base_reason": _sum_plog(p, la - lb),
            "kl_reason_base": _sum_plog(q, lb - la),
            "cross_entropy": -_sum_plog(p, lb),
            "jsd": 0.5 * _sum_plog(p, la - lm) + 0.5 * _sum_plog(q, lb - lm),
        }
    out["reason_top_rank_in_base"] = rank_by_sorting(a, int(np.argmax(b)))
    if y is None:
        out.update(logp_base=np.nan, logp_reason=np.nan, delta_logp=np.nan, rank_base=-1, rank_reason=-1)
    else:
        out.update(logp_base=la[y], logp_reason=lb[y], delta_logp=lb[y] - la[y],
                   rank_base=rank_by_sorting(a, y), rank_reason=rank_by_sorting(b, y))
    k = min(k, len(a))
    out["topk_base_probs"] = np.sort(p)[::-1][:k]
    out["topk_reason_probs"] = np.sort(q)[::-1][:k]
    return out


def reference_metrics(a: np.ndarray, b: np.ndarray, targets: np.ndarray | None, k: int = 10) -> dict[str, np.ndarray]:
    """(C, V) logits of each model, (C,) targets -> name -> (C,) float64 (or (C, k) for top-k probs)."""
    rows = [position_metrics(a[i], b[i], None if targets is None else int(targets[i]), k) for i in range(len(a))]
    if not rows:
        return {}
    return {name: np.array([r[name] for r in rows]) for name in rows[0]}
