"""Brute-force float64 reference for the per-token metrics, written from the formulas in docs/ARCHITECTURE.md.

Deliberately independent of core.scoring.metrics: plain numpy, one position at a time, no clamping, ranks by
sorting. `model_reference` runs each model's full float64 forward over prompt + response (no cache, no
chunking) and applies it. Used by test_metrics.py, test_scoring.py, test_big_vocab.py and test_gpu.py.
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
    out = {name: np.array([r[name] for r in rows]) for name in rows[0]}
    if targets is not None:
        out["_targets"] = np.asarray(targets)
    return out


SIDES = ("base", "reason")


def model_reference(pair, float64_models, prompt_ids: dict[str, list[int]], ids, k: int = 10) -> dict[str, np.ndarray]:
    """Each model's full float64 forward over its own prompt + the response, then `reference_metrics`.

    `float64_models(model)` returns a float64 copy of `model` (tests/conftest.py); any callable giving
    a model whose logits are the reference's works (e.g. the model itself, for "the same logits")."""
    import torch

    ids = [int(i) for i in ids]
    logits = {}
    for side in SIDES:
        model = float64_models(pair.model(side))
        seq = torch.tensor([prompt_ids[side] + ids], device=next(model.parameters()).device)
        with torch.no_grad():
            full = model(seq).logits[0].double()  # (P + T, V_embedding)
        start = len(prompt_ids[side]) - 1  # the logits at position i predict token i + 1
        logits[side] = full[start : start + len(ids), : pair.vocab_size].cpu().numpy()
    out = reference_metrics(logits["base"], logits["reason"], np.asarray(ids), k=k)
    out.update(logits_base=logits["base"], logits_reason=logits["reason"])  # for rank_bands
    return out


def rank_bands(logits: np.ndarray, token: int | np.ndarray, eps: float) -> tuple[int, int]:
    """(lowest, highest) rank of `token` when entries within `eps` of its logit may fall either side:
    a float32 forward cannot order logits closer than its own error (float64 `logits` (V,))."""
    tokens = np.atleast_1d(token)
    x = np.asarray(logits, dtype=np.float64)
    low = min(int(np.sum(x > x[t] + eps)) for t in tokens)
    high = max(int(np.sum(x > x[t] - eps)) for t in tokens)
    return low, high


def _rank_ok(name: str, got: int, i: int, ref: dict[str, np.ndarray], eps: float) -> bool:
    """Whether the rank `got` at position i is right up to logits within eps of the ranked token's."""
    la, lb = ref["logits_base"][i], ref["logits_reason"][i]
    if name == "reason_top_rank_in_base":  # argmax q may be any token within eps of the top
        low, high = rank_bands(la, np.flatnonzero(lb >= lb.max() - eps), eps)
    else:
        y = int(ref["_targets"][i])
        low, high = rank_bands(la if name == "rank_base" else lb, y, eps)
    return low <= got <= high


def reference_errors(trace, ref: dict[str, np.ndarray], atol: float = 1e-5, rtol: float = 0.0) -> list[str]:
    """Every metric (and top-k probability) of `trace` farther than atol + rtol·|ref| from the reference,
    as readable lines: metric, largest error, position, value. Empty when all match.

    With the float64 logits in `ref` (`model_reference`), a rank may differ where other logits lie
    within `atol` of the ranked token's (the float32 forward cannot order them): see `rank_bands`."""
    bad = []
    for name in (n for n in ref if not n.startswith(("topk_", "logits_", "_"))):
        got = np.asarray(trace.metrics[name], dtype=np.float64)
        if got.shape != ref[name].shape:
            bad.append(f"{name}: shape {got.shape} vs reference {ref[name].shape}")
            continue
        excess = np.abs(got - ref[name]) - (atol + rtol * np.abs(ref[name]))
        if name.startswith(("rank_", "reason_top_rank")) and "logits_base" in ref:
            for i in np.flatnonzero(excess > 0):
                if ref[name][i] >= 0 and _rank_ok(name, int(got[i]), int(i), ref, atol):
                    excess[i] = 0.0
        if len(excess) and excess.max() > 0:
            at = int(np.argmax(excess))
            bad.append(f"{name}: error {abs(got[at] - ref[name][at]):.3g} at position {at} (value {ref[name][at]:.6g})")
    for side in SIDES:
        err = np.max(np.abs(np.asarray(trace.topk[side][1], dtype=np.float64) - ref[f"topk_{side}_probs"]), initial=0.0)
        if err > max(atol, 1e-6):
            bad.append(f"topk_{side} probs: max abs error {err:.3g}")
    return bad
