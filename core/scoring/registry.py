"""The metric registry: every per-token metric's name, label, unit and use (score, gate), and reading scores.

`METRICS` (one `Metric` spec each) feeds the API, the CLI's choices, the app's selector, heatmap legends
and exports, so names, labels and units never drift. The maths is in `core/scoring/metrics.py`; this
module needs no torch, so reading stored traces starts fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from core import settings
from core.errors import InvalidInputError


@dataclass(frozen=True)
class Metric:
    """One per-token metric: how to name it to humans, its unit, and what it may be used for."""

    name: str
    label: str  # for humans, e.g. "Cross-entropy"
    unit: str  # "nats", "rank" or ""
    doc: str  # the formula, one line
    integer: bool = False  # ranks: int64 arrays, -1 where unknown
    is_score: bool = False  # can colour the heatmap and rank spikes (higher = more disagreement)
    can_gate: bool = False  # known before the token is chosen, so a policy may gate a takeover on it
    sign: int = 1  # as a score, sign * value is used (delta_logp: its negative)
    negated: str = ""  # the label of -value, when the score flips the sign (read better than "−(label)")

    @property
    def signed_label(self) -> str:
        """The label of the metric as a score (what `score_values` gives): −(label) when the sign is flipped."""
        return self.label if self.sign > 0 else self.negated or f"−({self.label})"

    @property
    def score_label(self) -> str:
        """`signed_label` with its unit."""
        return f"{self.signed_label} [{self.unit}]" if self.unit else self.signed_label


METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        Metric("entropy_base", "Base entropy", "nats", "H_b = -Σ p log p: base model uncertainty", is_score=True, can_gate=True),
        Metric("entropy_reason", "Reasoner entropy", "nats", "H_r = -Σ q log q: reasoning model uncertainty", is_score=True, can_gate=True),
        Metric("kl_base_reason", "KL(base‖reasoner)", "nats", "KL(p‖q) = Σ p (log p - log q): the paper's reverse KL", is_score=True, can_gate=True),
        Metric("kl_reason_base", "KL(reasoner‖base)", "nats", "KL(q‖p) = Σ q (log q - log p): forward KL", is_score=True, can_gate=True),
        Metric("cross_entropy", "Cross-entropy", "nats", "-Σ p log q = H_b + KL(p‖q): the paper's default score", is_score=True, can_gate=True),
        Metric("jsd", "Jensen-Shannon divergence", "nats", "JSD(p, q) = ½ KL(p‖m) + ½ KL(q‖m), m = ½(p + q); ≤ log 2", is_score=True, can_gate=True),
        Metric("logp_base", "Base log-prob of the token", "nats", "log p(y_t) of the emitted token"),
        Metric("logp_reason", "Reasoner log-prob of the token", "nats", "log q(y_t) of the emitted token"),
        Metric("delta_logp", "Log-prob gain (reasoner − base)", "nats", "log q(y_t) - log p(y_t); as a score its negative is used", is_score=True, sign=-1,
               negated="Log-prob loss (base − reasoner)"),
        Metric("rank_base", "Token rank under base", "rank", "rank of y_t under p (0 = top)", integer=True),
        Metric("rank_reason", "Token rank under reasoner", "rank", "rank of y_t under q (0 = top)", integer=True),
        Metric("reason_top_rank_in_base", "Base rank of the reasoner's top token", "rank", "rank under p of argmax q", integer=True),
    ]
}  # fmt: skip
SCORES: tuple[str, ...] = tuple(name for name, m in METRICS.items() if m.is_score)
GATE_SCORES: tuple[str, ...] = tuple(name for name, m in METRICS.items() if m.can_gate)
DEFAULT_SCORE: str = settings.SCORE
INT_METRICS: tuple[str, ...] = tuple(name for name, m in METRICS.items() if m.integer)


def list_metrics() -> list[Metric]:
    """Every metric's spec, in registry order (what `Trace.metrics` holds)."""
    return list(METRICS.values())


def metric_label(name: str) -> str:
    """The human label of a metric (its name when the registry has no such metric)."""
    spec = METRICS.get(name)
    return spec.label if spec is not None else name


def score_label(name: str) -> str:
    """The label of a metric used as a score, for values from `score_values` (−(label) where the score is
    the metric's negative, e.g. delta_logp; its name when the registry has no such metric)."""
    spec = METRICS.get(name)
    return spec.signed_label if spec is not None else name


def check_score(name: str) -> str:
    """Return `name` if it is a known score, else raise with the valid choices."""
    if name not in SCORES:
        raise InvalidInputError(f"Unknown score {name!r}; choose one of: {', '.join(SCORES)}")
    return name


def check_gate_score(name: str) -> str:
    """Return `name` if a policy may gate a takeover on it (known before the token is chosen), else raise."""
    check_score(name)
    if name not in GATE_SCORES:
        raise InvalidInputError(f"{name} depends on the emitted token, so it cannot gate a takeover; "
                                f"choose one of: {', '.join(GATE_SCORES)}")
    return name


def score_values(metrics: dict, name: str):
    """The per-token disagreement score `name` (higher = more disagreement) from a metrics dict."""
    check_score(name)
    values = metrics[name]
    return -values if METRICS[name].sign < 0 else values


# -- rank-shift categories of `reason_top_rank_in_base` (core/annotate/rank_shift.py draws and tabulates them) --
RANK_SHIFT_METRIC = "reason_top_rank_in_base"
RANK_SHIFT = "rank_shift"  # the colouring mode, the export column, the frame column
RANK_SHIFT_CATEGORIES = ("unshifted", "marginal", "shifted")
RANK_SHIFT_UNKNOWN = ""  # no rank recorded (negative / NaN rank)
MARGINAL_MAX_RANK = 2  # 0-based: base ranks 2..3 (1-based) are marginal


def rank_shift_category(ranks: Any) -> np.ndarray:
    """(T,) 0-based base ranks of the reasoner's top token -> (T,) category strings ("" when unknown)."""
    r = np.asarray(ranks, dtype=np.float64).reshape(-1)
    out = np.full(r.shape, RANK_SHIFT_UNKNOWN, dtype=object)
    known = np.isfinite(r) & (r >= 0)
    out[known & (r == 0)] = "unshifted"
    out[known & (r >= 1) & (r <= MARGINAL_MAX_RANK)] = "marginal"
    out[known & (r > MARGINAL_MAX_RANK)] = "shifted"
    return out
