"""Per-position disagreement metrics from two logit blocks: pure tensor maths, one implementation of each.

All metrics are in nats, computed in float32 (or the input's float64) after the matmul. Which metrics
exist, and their labels and units, is the registry's (`core/scoring/registry.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from core import settings
from core.errors import InvalidInputError

LOG2 = math.log(2.0)


# -- the maths: one implementation of every metric ---------------------------------------------------------
#
# Scoring calls `chunk_metrics` (the emitted tokens are known). Decoding calls `step_metrics` before it
# picks the token, then `emitted_metrics` on the log-probabilities that call kept: one log-softmax per
# position and model, so scoring, generation, branches and batches give the same numbers.


def _plogp_diff(p: torch.Tensor, log_a: torch.Tensor, log_b: torch.Tensor) -> torch.Tensor:
    """Σ p (log_a - log_b) over the last axis, with 0·(anything) = 0 where p == 0."""
    term = p * (log_a - log_b)
    return torch.where(p > 0, term, torch.zeros_like(term)).sum(-1)


# Rows x vocabulary per inner block on CPU: the ~20 passes over a block run faster while its (C, V)
# temporaries (2 MB each) stay in cache: 16 rows at V = 32k, 3 at V = 152k (at 152k, 1.4x faster than
# 32-row blocks; benchmarks/RESULTS.md, "Scoring"). GPUs take a chunk whole.
CPU_BLOCK_ELEMENTS = 1 << 19
_TOPK_BLOCK = 128  # vocabulary block size for the two-stage top-k
EMITTED = ("logp_base", "logp_reason", "delta_logp", "rank_base", "rank_reason")  # need the emitted token


@dataclass(frozen=True)
class LogProbs:
    """Both models' log-probabilities over a block of positions, kept by `step_metrics` so that the
    emitted-token metrics can be read once the tokens are chosen (`emitted_metrics`)."""

    base: torch.Tensor  # (C, V) log p
    reason: torch.Tensor  # (C, V) log q
    top_base: torch.Tensor  # (C, k) the largest log p per row, descending (ranks near the top are read here)
    top_reason: torch.Tensor

    def __len__(self) -> int:
        return self.base.shape[0]

    def rows(self, index: torch.Tensor | slice | list[int]) -> LogProbs:
        """The same log-probs for a subset of positions (e.g. the rows still decoding)."""
        return LogProbs(self.base[index], self.reason[index], self.top_base[index], self.top_reason[index])

    @staticmethod
    def cat(parts: list[LogProbs]) -> LogProbs:
        if len(parts) == 1:
            return parts[0]
        return LogProbs(*(torch.cat([getattr(p, f) for p in parts]) for f in ("base", "reason", "top_base", "top_reason")))


def _blocks(logits_base: torch.Tensor, logits_reason: torch.Tensor) -> list[slice]:
    if logits_base.shape != logits_reason.shape:
        raise InvalidInputError(f"logit blocks differ in shape: {tuple(logits_base.shape)} vs {tuple(logits_reason.shape)}")
    if logits_base.dim() != 2:
        raise InvalidInputError(f"logit blocks must be (positions, vocabulary); got shape {tuple(logits_base.shape)}")
    rows, vocab = logits_base.shape
    block = max(rows, 1) if logits_base.device.type != "cpu" else max(1, CPU_BLOCK_ELEMENTS // max(vocab, 1))
    return [slice(i, i + block) for i in range(0, max(rows, 1), block)]


def _cat(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return parts[0] if len(parts) == 1 else {name: torch.cat([part[name] for part in parts]) for name in parts[0]}


def chunk_metrics(
    logits_base: torch.Tensor,
    logits_reason: torch.Tensor,
    targets: torch.Tensor | None,
    k: int = settings.K,
) -> dict[str, torch.Tensor]:
    """All metrics for one block of positions whose emitted tokens are known (scoring).

    logits_* (C, V) over the shared vocabulary (already truncated), targets (C,) the emitted tokens
    (None when not known yet: target metrics are then NaN / -1). Returns name -> (C,) plus
    "topk_base_ids", "topk_base_probs", "topk_reason_ids", "topk_reason_probs" of shape (C, k).
    """
    blocks = _blocks(logits_base, logits_reason)
    width = min(blocks[0].stop, logits_base.shape[0])
    work = _Work(width, logits_base, _dtype(logits_base)) if len(blocks) > 1 else None
    parts = []
    for rows in blocks:
        c = len(range(*rows.indices(logits_base.shape[0])))
        buffers = work.take(c) if work is not None else None
        out, logprobs = _block_metrics(logits_base[rows], logits_reason[rows], k, buffers)
        scratch = buffers[5] if buffers is not None else None
        out.update(emitted_metrics(logprobs, None if targets is None else targets[rows], scratch))
        parts.append(out)
    return _cat(parts)


def step_metrics(logits_base: torch.Tensor, logits_reason: torch.Tensor,
                 k: int = settings.K) -> tuple[dict[str, torch.Tensor], LogProbs]:
    """Metrics of positions whose tokens are not chosen yet (decoding), and the log-probs to read the
    emitted-token metrics from later: `m, lp = step_metrics(a, b, k); ...; m.update(emitted_metrics(lp, y))`.

    `m` is what `chunk_metrics(a, b, None, k)` returns (emitted-token metrics NaN / -1 until updated)."""
    parts, kept = [], []
    for rows in _blocks(logits_base, logits_reason):
        out, logprobs = _block_metrics(logits_base[rows], logits_reason[rows], k)
        out.update(emitted_metrics(logprobs, None))
        parts.append(out)
        kept.append(logprobs)
    return _cat(parts), LogProbs.cat(kept)


def emitted_metrics(logprobs: LogProbs, targets: torch.Tensor | None,
                    _scratch: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """logp_base, logp_reason, delta_logp, rank_base, rank_reason of the emitted tokens `targets` (C,),
    read off log-probs kept by `step_metrics` (NaN / -1 where targets is None)."""
    la, lb = logprobs.base, logprobs.reason
    c = la.shape[0]
    if targets is None:
        nan = torch.full((c,), float("nan"), dtype=la.dtype, device=la.device)
        minus = torch.full((c,), -1, dtype=torch.long, device=la.device)
        return {"logp_base": nan, "logp_reason": nan.clone(), "delta_logp": nan.clone(),
                "rank_base": minus, "rank_reason": minus.clone()}
    y = torch.as_tensor(targets).reshape(-1, 1).to(device=la.device, dtype=torch.long, non_blocking=True)
    if y.shape[0] != c:
        raise InvalidInputError(f"{y.shape[0]} targets for {c} positions")
    lpb, lpr = la.gather(-1, y), lb.gather(-1, y)
    return {"logp_base": lpb.squeeze(-1), "logp_reason": lpr.squeeze(-1), "delta_logp": (lpr - lpb).squeeze(-1),
            "rank_base": _rank(la, lpb, logprobs.top_base, _scratch),
            "rank_reason": _rank(lb, lpr, logprobs.top_reason, _scratch)}


def _dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _block_metrics(logits_base: torch.Tensor, logits_reason: torch.Tensor, k: int,
                   work: list[torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], LogProbs]:
    """The token-free metrics of one block of rows (about 10 passes over (C, V) per model, no (C, V)
    masks) and the block's log-probs for `emitted_metrics`; `work`: six reused (C, V) buffers."""
    dtype = _dtype(logits_base)
    work = work or [torch.empty(logits_base.shape, dtype=dtype, device=logits_base.device) for _ in range(6)]
    la, p = _log_softmax(logits_base.to(dtype), (work[0], work[1]))  # (C, V) each
    lb, q = _log_softmax(logits_reason.to(dtype), (work[2], work[3]))
    # Row dots with torch's pairwise summation (what linalg.vecdot does, here into one reused buffer): a
    # BLAS matmul accumulates sequentially over V and is off by ~3e-5 at V = 32k (measured), which the
    # float64 reference tests catch.
    scratch = work[5]

    def dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.mul(x, y, out=scratch).sum(-1)

    s_pa, s_qb = dot(p, la), dot(q, lb)
    d = torch.sub(la, lb, out=work[4])
    kl_pq, kl_qp = dot(p, d), -dot(q, d)
    finite = bool(torch.isfinite(torch.stack([s_pa, s_qb, kl_pq])).all())  # False when a logit is -inf (0 · -inf)
    if finite:
        both = p.add_(q)  # 2m, in place: p and q are not needed after this
        # Σ m log m = ½ Σ (p+q) log(p+q) - log 2, as Σ (p+q) = 2; clamping underflowed entries changes
        # the sum by less than V · tiny · log(tiny)
        m_log_m = 0.5 * dot(both, torch.log(both.clamp_min_(torch.finfo(dtype).tiny), out=d)) - LOG2
        h_b, h_r, jsd = -s_pa, -s_qb, 0.5 * (s_pa + s_qb) - m_log_m
    else:
        h_b, h_r, kl_pq, kl_qp, jsd = _masked_sums(la, lb, p, q)
    del p, q, d
    out: dict[str, torch.Tensor] = {
        "entropy_base": h_b,
        "entropy_reason": h_r,
        "kl_base_reason": kl_pq.clamp_min(0.0),
        "kl_reason_base": kl_qp.clamp_min(0.0),
        "cross_entropy": h_b + kl_pq.clamp_min(0.0),
        "jsd": jsd.clamp(0.0, LOG2),
    }
    k = min(k, la.shape[-1])
    (top_lb, ids_b), (top_lr, ids_r) = _topk(la, k), _topk(lb, k)  # sorted, descending
    reason_top = _first_argmax(lb, top_lr, ids_r)
    out["reason_top_rank_in_base"] = _rank(la, la.gather(-1, reason_top), top_lb, scratch)
    out.update(topk_base_ids=ids_b, topk_base_probs=top_lb.exp(), topk_reason_ids=ids_r, topk_reason_probs=top_lr.exp())
    return out, LogProbs(la, lb, top_lb, top_lr)


def _log_softmax(x: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, V) -> (log-probs, probs), into `out` buffers if given. torch.log_softmax sums exp() sequentially
    in float32 and is off by up to ~4e-5 nats at V = 32k; torch.sum's pairwise summation keeps it near 1e-6."""
    log_out, prob_out = out if out is not None else (torch.empty_like(x), torch.empty_like(x))
    shifted = torch.sub(x, x.amax(-1, keepdim=True), out=log_out)
    probs = torch.exp(shifted, out=prob_out)
    total = probs.sum(-1, keepdim=True)
    return shifted.sub_(total.log()), probs.div_(total)


class _Work:
    """(rows, V) buffers reused block after block by one `chunk_metrics` call: a fresh array of a few MB
    per pass costs page faults (reusing them: 0.59 s instead of 0.97 s for 256 rows at V = 152k)."""

    def __init__(self, rows: int, like: torch.Tensor, dtype: torch.dtype) -> None:
        self.bufs = [torch.empty((rows, like.shape[-1]), dtype=dtype, device=like.device) for _ in range(6)]

    def take(self, rows: int) -> list[torch.Tensor]:
        return [buf[:rows] for buf in self.bufs]


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """(..., V) logits -> float32 (or float64) log-probabilities, by the maths every metric uses."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return _log_softmax(logits.to(dtype))[0]


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


def _rank(logp: torch.Tensor, value: torch.Tensor, top: torch.Tensor,
          scratch: torch.Tensor | None = None) -> torch.Tensor:
    """How many entries of each row of `logp` (C, V) exceed `value` (C, 1): read off the sorted top-k
    `top` (C, k) when the value is in it (every larger entry then is), else counted over V."""
    in_top = value.squeeze(-1) >= top[:, -1]
    rank = (top > value).sum(-1)
    rest = (~in_top).nonzero().squeeze(-1)
    if not len(rest):
        return rank
    if len(rest) < len(rank):  # count only the rows that need it
        logp, value = logp.index_select(0, rest), value.index_select(0, rest)
    # 0/1 as floats (a float sum of 0/1 is exact below 2**24): ~3x faster than summing a bool mask
    buf = scratch[: len(logp)] if scratch is not None and scratch.dtype == logp.dtype else torch.empty_like(logp)
    count = torch.gt(logp, value, out=buf).sum(-1)
    return rank.index_copy(0, rest, count.to(rank.dtype))


def target_metrics(logits_base: torch.Tensor, logits_reason: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Emitted-token metrics from logits (C, V) and targets (C,): the same numbers as `chunk_metrics`.

    Kept for callers that no longer hold `step_metrics`' log-probs; prefer `emitted_metrics` (no second
    log-softmax)."""
    _, logprobs = step_metrics(logits_base, logits_reason)
    return emitted_metrics(logprobs, targets)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """(C, V) logits -> (C,) entropy of softmax(logits) in nats (what an entropy gate needs, alone): the
    same maths as `entropy_base`."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    la, p = _log_softmax(logits.to(dtype))
    h = -torch.linalg.vecdot(p, la)
    if not bool(torch.isfinite(h).all()):  # -inf logits: 0 · log 0 = 0
        h = _plogp_diff(p, torch.zeros_like(la[..., :1]), la)
    return h


def top_probability(logits: torch.Tensor) -> torch.Tensor:
    """(C, V) logits -> (C,) the largest probability of each row (how sure a model is of its own best token)."""
    return torch.exp(logits.max(-1).values - torch.logsumexp(logits, -1))


def entropy_and_top2(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, V) logits -> ((C,) entropy in nats, (C, 2) the two largest probabilities): everything a gate on the
    base alone reads (entropy, Nudging's top-1 probability, the top-1/top-2 margin), from one softmax."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    la, p = _log_softmax(logits.to(dtype))
    h = -torch.linalg.vecdot(p, la)
    # -inf logits give a NaN entropy (0 · log 0 = 0 is summed below); entropies are at most log V, so their sum
    # is finite exactly when each is (one reduction and one read: this runs at every lazy decoding step)
    if not math.isfinite(float(h.sum())):
        h = _plogp_diff(p, torch.zeros_like(la[..., :1]), la)
    top = torch.topk(p, min(2, p.shape[-1]), dim=-1).values
    if top.shape[-1] < 2:
        top = torch.cat([top, torch.zeros_like(top)], dim=-1)
    return h, top
