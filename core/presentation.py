"""What the edges show of a trace, shared by the app and the notebook widget: the token view's hover
data, the takeover choices at a token, branch-tree labels and number formats. Plain data, no UI code."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.errors import InvalidInputError
from core.metrics import DEFAULT_SCORE, METRICS, score_values
from core.trace import SIDES, Trace


# Metrics shown on hover, in order; their labels come from core.metrics' registry.
HOVER_METRICS: tuple[str, ...] = (
    "cross_entropy", "kl_base_reason", "kl_reason_base", "jsd", "entropy_base", "entropy_reason", "delta_logp",
    "logp_base", "logp_reason", "rank_base", "rank_reason", "reason_top_rank_in_base",
)  # fmt: skip

def fmt_num(value: float | None) -> str:
    """A metric for a narrow display box: 3 significant digits, scientific below 1e-3 (never "0.00…")."""
    if value is None or not math.isfinite(float(value)):
        return "–"
    v = float(value)
    return "0" if v == 0 else f"{v:.2e}" if abs(v) < 1e-3 else f"{v:.3g}"


def fmt_prob(p: float | None, mode: str = "prob") -> str:
    """A probability for display: 3 significant digits (1.31e-02 never reads 0.000), or its log in nats."""
    if p is None or not math.isfinite(float(p)):
        return "–"
    p = float(p)
    if mode == "logprob":
        return "−inf" if p <= 0 else f"{math.log(p):.3f}"
    if p == 0:
        return "0"
    if 0.9995 <= p < 1.0:  # 3 significant digits would round to "1": show the gap instead
        return f"1−{1.0 - p:.1e}"
    return f"{p:.3g}" if p >= 1e-3 else f"{p:.2e}"

def spike_list(trace: Trace) -> list[int]:
    """Annotated spike positions (sorted ints), [] when the trace has none."""
    return [int(p) for p in (trace.annotations.get("spikes") or {}).get("positions", [])]

# -- hover data -----------------------------------------------------------------------------------


def _sig(values: Any, digits: int) -> np.ndarray:
    """Round to `digits` significant digits, vectorised (1.8e-05 stays 1.8e-05, never 0)."""
    x = np.asarray(values, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = 10.0 ** (digits - 1 - np.floor(np.log10(np.abs(x))))
        out = np.round(x * scale) / scale
    return np.where(np.isfinite(out), out, x)  # 0, inf and NaN pass through


def _clean(values: Any, digits: int = 4) -> list[float | None]:
    """Floats to `digits` significant digits for JSON, non-finite values as None (JSON has no NaN)."""
    return [None if not math.isfinite(v) else v for v in _sig(values, digits).tolist()]


def hover_data(trace: Trace, score: str = DEFAULT_SCORE, decode: Callable[[int], str] | None = None,
               k: int | None = None, prob_mode: str = "prob") -> dict[str, Any]:
    """Compact, JSON-ready per-token data for the hover card: tokens, sources, metrics, both top-k.

    Top-k ids refer into `vocab` (id -> text, raw model text: the browser sets it as text, never HTML).
    """
    k = trace.k if k is None else min(k, trace.k)
    ids = {side: np.asarray(trace.topk[side][0])[:, :k] for side in SIDES}
    probs = {side: np.asarray(trace.topk[side][1], dtype=np.float64)[:, :k] for side in SIDES}
    used = np.unique(np.concatenate([ids["base"].reshape(-1), ids["reason"].reshape(-1), trace.token_ids]))
    vocab = {str(int(i)): (decode(int(i)) if decode is not None else f"#{int(i)}") for i in used.tolist()}
    metrics = {name: _clean(trace.metrics[name]) for name in HOVER_METRICS if name in trace.metrics}
    return {
        "tokens": list(trace.tokens),
        "ids": trace.token_ids.tolist(),
        "source": [str(s) for s in trace.source],
        "score_name": METRICS[score].signed_label,
        "score": _clean(score_values(trace.metrics, score)),
        "metrics": metrics,
        "labels": {name: METRICS[name].label for name in HOVER_METRICS if name in METRICS},
        "top": {side: ids[side].tolist() for side in SIDES},
        "prob": {side: _sig(probs[side], 6).tolist() for side in SIDES},
        "prob_mode": prob_mode,
        "vocab": vocab,
        "tags": [str(t) if t is not None else "" for t in trace.annotations.get("tags", [""] * len(trace))],
    }

# -- takeover choices -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """One way to take over at a position: the reasoner's own pick (token None) or a fixed token id."""

    label: str
    token: int | None


def prob_at(trace: Trace, side: str, pos: int, token: int) -> float | None:
    """`side`'s probability of `token` at `pos` if it is in the stored top-k, else None (below the k-th)."""
    ids, probs = trace.topk[side]
    hits = np.flatnonzero(np.asarray(ids[pos]) == int(token))
    return float(np.asarray(probs[pos])[hits[0]]) if hits.size else None


def both_probs(trace: Trace, pos: int, token: int, mode: str = "prob") -> str:
    """"base p=…, reason p=…" for a token at `pos` ("< p_k" when outside that model's stored top-k)."""
    parts = []
    for side in SIDES:
        p = prob_at(trace, side, pos, token)
        if p is None:
            floor = float(np.asarray(trace.topk[side][1][pos]).min()) if trace.k else None
            parts.append(f"{side} p<{fmt_prob(floor, mode)}" if floor is not None else f"{side} p=?")
        else:
            parts.append(f"{side} {'log p' if mode == 'logprob' else 'p'}={fmt_prob(p, mode)}")
    return ", ".join(parts)


def takeover_choices(trace: Trace, pos: int, decode: Callable[[int], str] | None = None,
                     mode: str = "prob") -> list[Choice]:
    """"Reasoning model takes over here" first, then each distinct token of either model's top-k at `pos`,
    each labelled with both models' probabilities."""
    if not 0 <= pos < len(trace):
        raise InvalidInputError(f"Position {pos} is outside the trace (0..{len(trace) - 1})")
    show = (lambda i: repr(decode(i))) if decode is not None else (lambda i: f"#{i}")
    out = [Choice("reasoning model takes over here (its own choice)", None)]
    seen: set[int] = set()
    for side in ("reason", "base"):
        ids, _ = trace.topk[side]
        for rank, tok in enumerate(np.asarray(ids[pos]).tolist()):
            if tok in seen:
                continue
            seen.add(tok)
            emitted = " (emitted)" if tok == int(trace.token_ids[pos]) else ""
            out.append(Choice(f"{side} #{rank + 1}: {show(tok)}  {both_probs(trace, pos, tok, mode)}{emitted}", int(tok)))
    return out

def tree_rows(tree: dict[str, Any], depth: int = 0) -> list[tuple[int, dict[str, Any]]]:
    """A branch tree (TraceStore.tree) flattened depth-first as (depth, node) rows."""
    rows = [(depth, tree)]
    for child in tree.get("children", []):
        rows.extend(tree_rows(child, depth + 1))
    return rows


def tree_label(depth: int, node: dict[str, Any], what: str = "") -> str:
    """One line of the branch tree: indentation, where it branched and with what token, length, short key."""
    where = "root" if node.get("branch_pos") is None else f"branch @ {node['branch_pos']}"
    if what:
        where += f" {what}"
    return f"{'　' * depth}{'└ ' if depth else ''}{where} · {node.get('n_tokens')} tokens · {str(node['key'])[:8]}"


def branch_token_text(trace: Trace, decode: Callable[[int], str] | None = None) -> str:
    """What a branch put at its branch position: "forced 'x'" or "reasoner 'x'" ("" for a root)."""
    pos = trace.meta.get("branch_pos")
    if pos is None or not 0 <= int(pos) < len(trace):
        return ""
    pos = int(pos)
    tok = int(trace.token_ids[pos])
    text = decode(tok) if decode is not None else trace.tokens[pos]
    who = "forced" if str(trace.source[pos]) == "forced" else "reasoner"
    return f"{who} {text!r}"
