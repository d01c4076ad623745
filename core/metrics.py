"""Per-position disagreement metrics from two logit blocks: pure tensor maths, nothing else.

All metrics are in nats, computed in float32 (or the input's float64) after the matmul. The registry
`METRICS` feeds the API, the CLI's choices and the app's selector, so names never drift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from core.errors import InvalidInputError

LOG2 = math.log(2.0)


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


# Rows per inner block on CPU: ~20 passes over the vocabulary run ~1.3x faster on 32-row blocks than on a
# 256-row chunk, whose temporaries fall out of cache (benchmarks/RESULTS.md, "Scoring"). GPUs take it whole.
CPU_BLOCK = 32
_TOPK_BLOCK = 128  # vocabulary block size for the two-stage top-k


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
    rows = logits_base.shape[0]
    block = rows if logits_base.device.type != "cpu" else CPU_BLOCK
    if rows <= block:
        return _block_metrics(logits_base, logits_reason, targets, k)
    parts = [
        _block_metrics(logits_base[i : i + block], logits_reason[i : i + block],
                       None if targets is None else targets[i : i + block], k)
        for i in range(0, rows, block)
    ]
    return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}


def _block_metrics(logits_base: torch.Tensor, logits_reason: torch.Tensor, targets: torch.Tensor | None,
                   k: int) -> dict[str, torch.Tensor]:
    """chunk_metrics for one block of rows: about 10 passes over (C, V) per model, no (C, V) masks."""
    dtype = torch.float64 if logits_base.dtype == torch.float64 else torch.float32
    la, p = _log_softmax(logits_base.to(dtype))  # (C, V) each
    lb, q = _log_softmax(logits_reason.to(dtype))
    # Row dots with torch's pairwise summation: a BLAS matmul accumulates sequentially over V and is
    # off by ~3e-5 at V = 32k (measured), which the float64 reference tests catch.
    dot = torch.linalg.vecdot
    s_pa, s_qb = dot(p, la), dot(q, lb)
    d = la - lb
    kl_pq, kl_qp = dot(p, d), -dot(q, d)
    finite = bool(torch.isfinite(torch.stack([s_pa, s_qb, kl_pq])).all())  # False when a logit is -inf (0 · -inf)
    if finite:
        both = p + q  # 2m
        # Σ m log m = ½ Σ (p+q) log(p+q) - log 2, as Σ (p+q) = 2
        m_log_m = 0.5 * dot(both, both.clamp_min(torch.finfo(dtype).tiny).log_()) - LOG2
        h_b, h_r, jsd = -s_pa, -s_qb, 0.5 * (s_pa + s_qb) - m_log_m
    else:
        h_b, h_r, kl_pq, kl_qp, jsd = _masked_sums(la, lb, p, q)
    out: dict[str, torch.Tensor] = {
        "entropy_base": h_b,
        "entropy_reason": h_r,
        "kl_base_reason": kl_pq.clamp_min(0.0),
        "kl_reason_base": kl_qp.clamp_min(0.0),
        "cross_entropy": h_b + kl_pq.clamp_min(0.0),
        "jsd": jsd.clamp(0.0, LOG2),
    }
    c, v = la.shape
    k = min(k, v)
    (top_lb, ids_b), (top_lr, ids_r) = _topk(la, k), _topk(lb, k)  # sorted, descending
    reason_top = _first_argmax(lb, top_lr, ids_r)
    out["reason_top_rank_in_base"] = _rank(la, la.gather(-1, reason_top), top_lb, finite)
    if targets is None:
        nan = torch.full((c,), float("nan"), dtype=dtype, device=la.device)
        minus = torch.full((c,), -1, dtype=torch.long, device=la.device)
        out.update(logp_base=nan, logp_reason=nan.clone(), delta_logp=nan.clone(),
                   rank_base=minus, rank_reason=minus.clone())
    else:
        y = targets.reshape(-1, 1).to(la.device)
        lpb, lpr = la.gather(-1, y), lb.gather(-1, y)
        out.update(logp_base=lpb.squeeze(-1), logp_reason=lpr.squeeze(-1), delta_logp=(lpr - lpb).squeeze(-1),
                   rank_base=_rank(la, lpb, top_lb, finite), rank_reason=_rank(lb, lpr, top_lr, finite))
    out.update(topk_base_ids=ids_b, topk_base_probs=top_lb.exp(), topk_reason_ids=ids_r, topk_reason_probs=top_lr.exp())
    return out


def _log_softmax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, V) -> (log-probs, probs). torch.log_softmax sums exp() sequentially in float32 and is off by
    up to ~4e-5 nats at V = 32k; torch.sum's pairwise summation keeps the error near 1e-6."""
    shifted = x - x.amax(-1, keepdim=True)
    probs = shifted.exp()
    total = probs.sum(-1, keepdim=True)
    return shifted.sub_(total.log()), probs.div_(total)


def _masked_sums(la: torch.Tensor, lb: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """H_b, H_r, KL(p‖q), KL(q‖p), JSD with 0 · log 0 = 0: the slow, exact path for -inf logits."""
    zero = torch.zeros_like(la[..., :1])
    lm = torch.logaddexp(la, lb) - LOG2
    return (_plogp_diff(p, zero, la), _plogp_diff(q, zero, lb), _plogp_diff(p, la, lb), _plogp_diff(q, lb, la),
            0.5 * _plogp_diff(p, la, lm) + 0.5 * _plogp_diff(q, lb, lm))


def _topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, V) -> the k largest values per row, sorted descending, and their ids.

    Two stages: the k blocks with the largest maxima hold a top-k set (any value above the k-th
    largest sits in a block whose max beats every block outside them), so one cheap pass over V
    replaces the partial sort over all of it."""
    r, v = x.shape
    nb = v // _TOPK_BLOCK
    if nb <= 4 * k:
        values, ids = x.topk(k, dim=-1)
        return values, ids
    body = x[:, : nb * _TOPK_BLOCK].reshape(r, nb, _TOPK_BLOCK)
    best = body.amax(-1).topk(k, dim=-1, sorted=False).indices  # (R, k) block ids
    cand = body.gather(1, best.unsqueeze(-1).expand(r, k, _TOPK_BLOCK)).reshape(r, k * _TOPK_BLOCK)
    cand_ids = (best.unsqueeze(-1) * _TOPK_BLOCK + torch.arange(_TOPK_BLOCK, device=x.device)).reshape(r, -1)
    if nb * _TOPK_BLOCK < v:  # the tail that does not fill a block is always a candidate
        cand = torch.cat([cand, x[:, nb * _TOPK_BLOCK :]], dim=1)
        tail = torch.arange(nb * _TOPK_BLOCK, v, device=x.device).expand(r, -1)
        cand_ids = torch.cat([cand_ids, tail], dim=1)
    values, pos = cand.topk(k, dim=-1)
    return values, cand_ids.gather(1, pos)


def _first_argmax(logp: torch.Tensor, top: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(C, 1) argmax of each row (the first of ties, as torch.argmax), read off the sorted top-k when
    fewer than k entries tie for the maximum (torch.argmax on CPU is a slow scalar loop)."""
    at_max = top == top[:, :1]
    first = torch.where(at_max, ids, torch.iinfo(ids.dtype).max).amin(-1, keepdim=True)
    crowded = at_max[:, -1].nonzero().squeeze(-1)  # k or more ties: the first may lie outside the top-k
    if len(crowded):
        first = first.index_copy(0, crowded, logp.index_select(0, crowded).argmax(-1, keepdim=True))
    return first


def _rank(logp: torch.Tensor, value: torch.Tensor, top: torch.Tensor, finite: bool) -> torch.Tensor:
    """How many entries of each row of `logp` (C, V) exceed `value` (C, 1): read off the sorted top-k
    `top` (C, k) when the value is in it (every larger entry then is), else counted over V."""
    in_top = value.squeeze(-1) >= top[:, -1]
    rank = (top > value).sum(-1)
    rest = (~in_top).nonzero().squeeze(-1)
    if not len(rest):
        return rank
    if len(rest) < len(rank):  # count only the rows that need it
        logp, value = logp.index_select(0, rest), value.index_select(0, rest)
    # finite: x - value > 0 exactly when x > value, and a float sum of 0/1 is exact below 2**24
    count = (logp - value).clamp_min_(0).sign_().sum(-1) if finite else (logp > value).sum(-1)
    return rank.index_copy(0, rest, count.to(rank.dtype))


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
