"""Per-position disagreement metrics from two logit blocks: pure tensor maths, nothing else.

All metrics are in nats, computed in float32 (or the input's float64) after the matmul. The registry
`METRICS` feeds the API, the CLI's choices and the app's selector, so names never drift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from core.errors import InvalidInputError


@dataclass(frozen=True)
class Metric:
    name: str
    doc: str
    is_score: bool  # usable as a disagreement score (spikes, gates, colour scales)


METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        Metric("entropy_base", "H_b = -Σ p log p: base model uncertainty", True),
        Metric("entropy_reason", "H_r = -Σ q log q: reasoning model uncertainty", False),
        Metric("kl_base_reason", "KL(p‖q) = Σ p (log p - log q): the paper's reverse KL", True),
        Metric("kl_reason_base", "KL(q‖p) = Σ q (log q - log p): forward KL", True),
        Metric("cross_entropy", "-Σ p log q = H_b + KL(p‖q): the paper's default score", True),
        Metric("jsd", "Jensen-Shannon divergence, ≤ log 2", True),
        Metric("logp_base", "log p(y_t) of the emitted token", False),
        Metric("logp_reason", "log q(y_t) of the emitted token", False),
        Metric("delta_logp", "log q(y_t) - log p(y_t); as a score its negative is used", True),
        Metric("rank_base", "rank of y_t under p (0 = top)", False),
        Metric("rank_reason", "rank of y_t under q (0 = top)", False),
        Metric("reason_top_rank_in_base", "rank under p of argmax q", False),
    ]
}
SCORES: tuple[str, ...] = tuple(name for name, m in METRICS.items() if m.is_score)
DEFAULT_SCORE = "cross_entropy"
INT_METRICS = ("rank_base", "rank_reason", "reason_top_rank_in_base")


def check_score(name: str) -> str:
    """Return `name` if it is a known score, else raise with the valid choices."""
    if name not in SCORES:
        raise InvalidInputError(f"Unknown score {name!r}; choose one of: {', '.join(SCORES)}")
    return name


def score_values(metrics: dict, name: str):
    """The per-token disagreement score `name` (higher = more disagreement) from a metrics dict."""
    check_score(name)
    values = metrics[name]
    return -values if name == "delta_logp" else values


def _plogp_diff(p: torch.Tensor, log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """Σ p (log_a - log_b) over the last axis, with 0·(anything) = 0 where p == 0."""
    term = p * (log_a - log_b)
    return torch.where(p > 0, term, torch.zeros_like(term)).sum(-1)


def chunk_metrics(
    logits_base: torch.Tensor,
    logits_reason: torch.Tensor,
    targets: torch.Tensor | None,
    k: int = 10,
) -> dict[str, torch.Tensor]:
    """All metrics for one block of positions.

    logits_* (C, V) over the shared vocabulary (already truncated), targets (C,) the emitted tokens
    (None when not known yet: target metrics are then NaN / -1). Returns name -> (C,) plus
    "topk_base_ids", "topk_base_probs", "topk_reason_ids", "topk_reason_probs" of shape (C, k).
    """
    if logits_base.shape != logits_reason.shape:
        raise InvalidInputError(f"logit blocks differ in shape: {tuple(logits_base.shape)} vs {tuple(logits_reason.shape)}")
    dtype = torch.float64 if logits_base.dtype == torch.float64 else torch.float32
    a = logits_base.to(dtype)
    b = logits_reason.to(dtype)
    la = torch.log_softmax(a, dim=-1)  # (C, V)
    lb = torch.log_softmax(b, dim=-1)
    p = la.exp()
    q = lb.exp()
    zero = torch.zeros_like(la[..., :1])
    h_b = _plogp_diff(p, zero, la)
    h_r = _plogp_diff(q, zero, lb)
    kl_pq = _plogp_diff(p, la, lb)
    kl_qp = _plogp_diff(q, lb, la)
    lm = torch.logaddexp(la, lb) - math.log(2.0)
    jsd = 0.5 * _plogp_diff(p, la, lm) + 0.5 * _plogp_diff(q, lb, lm)
    out: dict[str, torch.Tensor] = {
        "entropy_base": h_b,
        "entropy_reason": h_r,
        "kl_base_reason": kl_pq.clamp_min(0.0),
        "kl_reason_base": kl_qp.clamp_min(0.0),
        "cross_entropy": h_b + kl_pq.clamp_min(0.0),
        "jsd": jsd.clamp(0.0, math.log(2.0)),
    }
    reason_top = b.argmax(-1, keepdim=True)
    out["reason_top_rank_in_base"] = (a > a.gather(-1, reason_top)).sum(-1)
    out.update(_target_metrics(la, lb, targets))
    k = min(k, a.shape[-1])
    pb, ib = p.topk(k, dim=-1)
    pr, ir = q.topk(k, dim=-1)
    out.update(topk_base_ids=ib, topk_base_probs=pb, topk_reason_ids=ir, topk_reason_probs=pr)
    return out


def _target_metrics(la: torch.Tensor, lb: torch.Tensor, targets: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Emitted-token metrics from log-probs (C, V) and targets (C,); NaN / -1 when targets is None."""
    if targets is None:
        nan = torch.full(la.shape[:-1], float("nan"), dtype=la.dtype, device=la.device)
        minus = torch.full(la.shape[:-1], -1, dtype=torch.long, device=la.device)
        return {"logp_base": nan, "logp_reason": nan.clone(), "delta_logp": nan.clone(),
                "rank_base": minus, "rank_reason": minus.clone()}
    y = targets.reshape(-1, 1).to(la.device)
    lpb = la.gather(-1, y).squeeze(-1)
    lpr = lb.gather(-1, y).squeeze(-1)
    return {"logp_base": lpb, "logp_reason": lpr, "delta_logp": lpr - lpb,
            "rank_base": (la > lpb.unsqueeze(-1)).sum(-1), "rank_reason": (lb > lpr.unsqueeze(-1)).sum(-1)}


def target_metrics(logits_base: torch.Tensor, logits_reason: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """logp, delta_logp and ranks of the emitted tokens: logits (C, V), targets (C,) -> name -> (C,)."""
    return _target_metrics(torch.log_softmax(logits_base.float(), -1), torch.log_softmax(logits_reason.float(), -1),
                           targets)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """(C, V) logits -> (C,) entropy of softmax(logits) in nats (what an entropy gate needs, alone)."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    p = log_p.exp()
    return -torch.where(p > 0, p * log_p, torch.zeros_like(p)).sum(-1)
