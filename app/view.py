"""Plain helpers behind the pages: reshape core's records for display. No streamlit, no model maths.

Everything numeric comes from `core` (metrics, spikes, tags, grading); these functions only select,
slice, round and label.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from core.spike_rules import Gate, spikes, top_count
from core.metrics import DEFAULT_SCORE, SCORES, score_values
from core.errors import InvalidInputError
from core.planning import annotate_tags
from core.evaluation.problems import Problem
from core.trace import SIDES, Trace

# Metrics shown on hover, in order (name, label).
HOVER_METRICS: tuple[tuple[str, str], ...] = (
    ("cross_entropy", "CE"), ("kl_base_reason", "KL(b‖r)"), ("kl_reason_base", "KL(r‖b)"), ("jsd", "JSD"),
    ("entropy_base", "H base"), ("entropy_reason", "H reason"), ("delta_logp", "Δlogp"),
    ("logp_base", "log p base"), ("logp_reason", "log p reason"), ("rank_base", "rank base"),
    ("rank_reason", "rank reason"), ("reason_top_rank_in_base", "reasoner's top in base"),
)  # fmt: skip
SCORE_LABELS = {
    "cross_entropy": "cross-entropy  −Σ p log q",
    "kl_base_reason": "KL(base ‖ reason)",
    "kl_reason_base": "KL(reason ‖ base)",
    "jsd": "Jensen-Shannon",
    "entropy_base": "base entropy",
    "delta_logp": "Δ log p (reason − base), negated",
}
DEFAULT_TOP = 0.05  # spikes: top 5% of a trace's tokens (demo traces are short; the paper's 1% gives ~1)


def md_code(value: object, limit: int = 80) -> str:
    """Any text as a Markdown inline-code span (shown literally: no links, images or emphasis)."""
    text = " ".join(str(value).split()).replace("`", "ʼ")
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return f"`{text}`" if text else "`(empty)`"


# -- spike rules ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpikeRule:
    """How spikes are chosen: the top fraction `top` of a trace's scores, or a calibrated `gate`."""

    top: float | None = DEFAULT_TOP
    gate: Gate | None = None

    def key(self) -> str:
        """A stable string for caching."""
        return json.dumps({"top": self.top, "gate": self.gate.to_dict() if self.gate else None}, sort_keys=True)

    def describe(self) -> str:
        if self.gate is not None:
            g = self.gate
            return f"gate τ={g.tau:.3g}, λ={g.lam:.3g}, W={g.window}"
        return f"top {100 * (self.top or 0):g}%"


def annotate_view(trace: Trace, score: str = DEFAULT_SCORE, rule: SpikeRule | None = None) -> Trace:
    """The trace with the layers the Trace page shows: spikes under `rule`, planning tags, segments."""
    rule = rule or SpikeRule()
    out = spikes(trace, score=score, gate=rule.gate) if rule.gate else spikes(trace, score=score, top=rule.top)
    if "tags" not in out.annotations or "segments" not in out.annotations:
        tagged = annotate_tags(out)
        layers = {name: tagged.annotations[name] for name in ("tags", "segments") if name not in out.annotations}
        out = out.annotate(**layers)
    return out


def spike_list(trace: Trace) -> list[int]:
    """Annotated spike positions (sorted ints), [] when the trace has none."""
    return [int(p) for p in (trace.annotations.get("spikes") or {}).get("positions", [])]


def spike_count(n_tokens: int, rule: SpikeRule) -> int | None:
    """Spikes a trace of `n_tokens` gets under a top-p rule (None for a gate: it depends on the scores)."""
    if rule.gate is not None:
        return None
    return top_count(rule.top or DEFAULT_TOP, int(n_tokens))


# -- hover data -----------------------------------------------------------------------------------


def _clean(values: Any, digits: int = 3) -> list[float | None]:
    """Floats rounded for JSON, non-finite values as None (JSON has no NaN)."""
    arr = np.round(np.asarray(values, dtype=np.float64), digits)
    return [None if not math.isfinite(v) else v for v in arr.tolist()]


def hover_data(trace: Trace, score: str = DEFAULT_SCORE, decode: Callable[[int], str] | None = None,
               k: int | None = None) -> dict[str, Any]:
    """Compact, JSON-ready per-token data for the hover card: tokens, sources, metrics, both top-k.

    Top-k ids refer into `vocab` (id -> text, raw model text: the browser sets it as text, never HTML).
    """
    k = trace.k if k is None else min(k, trace.k)
    ids = {side: np.asarray(trace.topk[side][0])[:, :k] for side in SIDES}
    probs = {side: np.asarray(trace.topk[side][1], dtype=np.float64)[:, :k] for side in SIDES}
    used = np.unique(np.concatenate([ids["base"].reshape(-1), ids["reason"].reshape(-1), trace.token_ids]))
    vocab = {str(int(i)): (decode(int(i)) if decode is not None else f"#{int(i)}") for i in used.tolist()}
    metrics = {name: _clean(trace.metrics[name]) for name, _ in HOVER_METRICS if name in trace.metrics}
    return {
        "tokens": list(trace.tokens),
        "ids": trace.token_ids.tolist(),
        "source": [str(s) for s in trace.source],
        "score_name": score,
        "score": _clean(score_values(trace.metrics, score)),
        "metrics": metrics,
        "labels": {name: label for name, label in HOVER_METRICS},
        "top": {side: ids[side].tolist() for side in SIDES},
        "prob": {side: np.round(probs[side], 4).tolist() for side in SIDES},
        "vocab": vocab,
        "tags": [str(t) if t is not None else "" for t in trace.annotations.get("tags", [""] * len(trace))],
    }


# -- takeover choices -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """One way to take over at a position: the reasoner's own pick (token None) or a fixed token id."""

    label: str
    token: int | None


def takeover_choices(trace: Trace, pos: int, decode: Callable[[int], str] | None = None) -> list[Choice]:
    """"Reasoning model takes over here" first, then each distinct token of either model's top-k at `pos`."""
    if not 0 <= pos < len(trace):
        raise InvalidInputError(f"Position {pos} is outside the trace (0..{len(trace) - 1})")
    show = (lambda i: repr(decode(i))) if decode is not None else (lambda i: f"#{i}")
    out = [Choice("reasoning model takes over here (its own choice)", None)]
    seen: set[int] = set()
    for side in ("reason", "base"):
        ids, probs = trace.topk[side]
        for rank, (tok, p) in enumerate(zip(np.asarray(ids[pos]).tolist(), np.asarray(probs[pos]).tolist())):
            if tok in seen:
                continue
            seen.add(tok)
            emitted = " (emitted)" if tok == int(trace.token_ids[pos]) else ""
            out.append(Choice(f"{side} #{rank + 1}: {show(tok)}  p={p:.3f}{emitted}", int(tok)))
    return out


# -- branches -------------------------------------------------------------------------------------


def first_difference(a: Trace, b: Trace, start: int = 0) -> int | None:
    """First position ≥ start where the two token sequences differ (a length difference counts), or None."""
    n = min(len(a), len(b))
    if start < n:
        diff = np.flatnonzero(a.token_ids[start:n] != b.token_ids[start:n])
        if diff.size:
            return int(start + diff[0])
    longest = max(len(a), len(b))
    return max(n, start) if len(a) != len(b) and max(n, start) < longest else None


def tail(trace: Trace, start: int) -> Trace:
    """The tokens from `start` on as a new trace (metrics, top-k, sources and token layers cut alike)."""
    start = max(0, min(int(start), len(trace)))
    cut = {}
    for name, layer in trace.annotations.items():
        if isinstance(layer, (list, tuple)) and len(layer) == len(trace):
            cut[name] = list(layer[start:])
    spikes_layer = trace.annotations.get("spikes")
    if isinstance(spikes_layer, dict):
        cut["spikes"] = {**spikes_layer, "positions": [p - start for p in spikes_layer.get("positions", []) if p >= start]}
    return Trace(
        token_ids=trace.token_ids[start:], tokens=trace.tokens[start:], prompt_ids=trace.prompt_ids,
        metrics={name: np.asarray(v)[start:] for name, v in trace.metrics.items()},
        topk={side: (ids[start:], probs[start:]) for side, (ids, probs) in trace.topk.items()},
        source=trace.source[start:], meta=trace.meta, annotations=cut,
    )


def tree_rows(tree: dict[str, Any], depth: int = 0) -> list[tuple[int, dict[str, Any]]]:
    """A branch tree (TraceStore.tree) flattened depth-first as (depth, node) rows."""
    rows = [(depth, tree)]
    for child in tree.get("children", []):
        rows.extend(tree_rows(child, depth + 1))
    return rows


def tree_label(depth: int, node: dict[str, Any]) -> str:
    """One line of the branch tree: indentation, where it branched, length and a short key."""
    where = "root" if node.get("branch_pos") is None else f"branch @ {node['branch_pos']}"
    return f"{'　' * depth}{'└ ' if depth else ''}{where} · {node.get('n_tokens')} tokens · {str(node['key'])[:8]}"


# -- problems and the Problems table --------------------------------------------------------------


def as_problems(rows: Iterable[Any]) -> list[Problem]:
    """Problems from core.problems records or plain dicts (demo rows: id, question, answer)."""
    out = []
    for i, row in enumerate(rows):
        if isinstance(row, Problem):
            out.append(row)
            continue
        prompt = row.get("prompt") or row.get("question") or row.get("problem")
        gold = row.get("gold", row.get("answer"))
        out.append(Problem(str(row.get("id", f"problem-{i}")), str(prompt), None if gold is None else str(gold)))
    return out


TABLE_COLUMNS = ["problem", "prompt", "pair", "policy", "kind", "n_tokens", "max", "top100_mean", "spikes",
                 "takeovers", "rho", "correct", "branch_pos", "created", "key"]  # fmt: skip


def trace_table(summaries: pd.DataFrame, score: str = DEFAULT_SCORE, rule: SpikeRule | None = None) -> pd.DataFrame:
    """The Problems page table: one row per stored trace with the chosen score's max and top-100 mean."""
    if score not in SCORES:
        raise InvalidInputError(f"Unknown score {score!r}; choose one of: {', '.join(SCORES)}")
    rule = rule or SpikeRule()
    if summaries.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    df = pd.DataFrame({
        "problem": summaries["problem"].astype("string"),
        "prompt": summaries["prompt"].astype("string"),
        "pair": summaries["pair"],
        "policy": summaries["policy"],
        "kind": summaries["kind"],
        "n_tokens": summaries["n_tokens"].astype("Int64"),
        "max": pd.to_numeric(summaries[f"max_{score}"], errors="coerce"),
        "top100_mean": pd.to_numeric(summaries[f"top100_{score}"], errors="coerce"),
        "spikes": [spike_count(n, rule) if rule.gate is None else s
                   for n, s in zip(summaries["n_tokens"], summaries["n_spikes"])],
        "takeovers": summaries["n_takeovers"].astype("Int64"),
        "rho": pd.to_numeric(summaries["rho"], errors="coerce"),
        "correct": summaries["correct"].astype("boolean"),
        "branch_pos": summaries["branch_pos"].astype("Int64"),
        "created": summaries["created"],
        "key": summaries["key"],
    })
    df["spikes"] = df["spikes"].astype("Int64")
    return df.reset_index(drop=True)


def filter_table(df: pd.DataFrame, text: str = "", policies: Sequence[str] = (), kinds: Sequence[str] = (),
                 correct: str = "any") -> pd.DataFrame:
    """Rows whose problem/prompt contains `text` (case-insensitive), of the given policies and kinds,
    with `correct` in any / yes / no / ungraded."""
    keep = pd.Series(True, index=df.index)
    if text:
        needle = text.lower()
        hay = df["problem"].fillna("").str.lower() + " " + df["prompt"].fillna("").str.lower()
        keep &= hay.str.contains(needle, regex=False)
    if policies:
        keep &= df["policy"].isin(list(policies))
    if kinds:
        keep &= df["kind"].isin(list(kinds))
    if correct == "yes":
        keep &= df["correct"].fillna(False).astype(bool)
    elif correct == "no":
        keep &= (~df["correct"].fillna(True).astype(bool))
    elif correct == "ungraded":
        keep &= df["correct"].isna()
    elif correct != "any":
        raise InvalidInputError(f"Unknown correct filter {correct!r}; choose one of: any, yes, no, ungraded")
    return df[keep].reset_index(drop=True)
