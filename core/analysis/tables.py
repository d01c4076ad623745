"""The seed paper's analyses as pure functions: lists of traces in, tidy DataFrames out.

Every function takes `score=` (a name from `core.divergence.SCORES`) and `segment=None|"think"|
"answer"`: with a segment, a trace that carries annotations["segments"] is cut to the positions of
that segment (and analysed as if that were the whole response); a trace without the layer is kept
whole. Figures live in `core.analysis_report`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from core.spike_rules import spike_positions, top_positions
from core.metrics import DEFAULT_SCORE, check_score, score_values
from core.errors import ForkpointError, InvalidInputError
from core.trace import Trace

log = logging.getLogger(__name__)

SEGMENTS = (None, "think", "answer")
POOLED = "pooled"
ENTROPY = "entropy_base"
RANK_AT = ("all", "spikes")
TAKEN_SOURCES_EXCLUDE = "base"  # a token counts as taken over when its source is anything else


# -- shared helpers -----------------------------------------------------------------------------


def _check_segment(segment: str | None) -> None:
    if segment not in SEGMENTS:
        raise InvalidInputError(f"Unknown segment {segment!r}; choose one of: None, think, answer")


def _as_list(traces: Trace | Sequence[Trace]) -> list[Trace]:
    return [traces] if isinstance(traces, Trace) else list(traces)


def _label(trace: Trace, i: int) -> str:
    return trace.key or f"trace{i}"


def _view(trace: Trace, segment: str | None) -> np.ndarray:
    """Positions (sorted int64) of the trace that the analysis looks at."""
    if segment is None or "segments" not in trace.annotations:
        return np.arange(len(trace), dtype=np.int64)
    segs = np.asarray(trace.annotations["segments"], dtype=object)
    return np.flatnonzero(segs == segment).astype(np.int64)


def _values(trace: Trace, score: str, segment: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(positions, score values at those positions) for one trace."""
    pos = _view(trace, segment)
    vals = np.asarray(score_values(trace.metrics, score), dtype=np.float64).reshape(-1)
    return pos, vals[pos]


def _prepare(traces: Trace | Sequence[Trace], score: str, segment: str | None) -> list[Trace]:
    check_score(score)
    _check_segment(segment)
    return _as_list(traces)


# -- sparsity: Lorenz curve, Gini, mass fraction ------------------------------------------------


def _mass(values: np.ndarray) -> np.ndarray:
    """Non-negative mass: NaNs dropped, negatives clipped to 0 (Δlog p scores can be negative)."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    return np.clip(v[~np.isnan(v)], 0.0, None)


def gini(values: Sequence[float] | np.ndarray) -> float:
    """Gini coefficient sum_ij |x_i - x_j| / (2 n^2 mean): 0 = equal, (n-1)/n = all mass on one.

    The standard (population) definition, so [0, 0, 0, 1] gives 0.75. Negatives are clipped to 0 and
    NaNs dropped; an all-zero vector gives 0, an empty one NaN.
    """
    v = np.sort(_mass(values))
    n = v.size
    if n == 0:
        return float("nan")
    total = v.sum()
    if total <= 0:
        return 0.0
    ranks = np.arange(1, n + 1, dtype=np.float64)
    return float(2.0 * (ranks * v).sum() / (n * total) - (n + 1) / n)


def lorenz_points(values: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lorenz curve (x, y), each (n+1,): x = share of tokens (lowest first), y = share of mass held."""
    v = np.sort(_mass(values))
    n = v.size
    x = np.arange(n + 1, dtype=np.float64) / max(n, 1)
    total = v.sum()
    if total <= 0:
        return x, x.copy()
    y = np.concatenate([[0.0], np.cumsum(v)]) / total
    return x, y


def mass_fraction_value(values: Sequence[float] | np.ndarray, mass: float = 0.8) -> float:
    """Smallest share of tokens (highest scores first) that holds at least `mass` of the total."""
    if not 0.0 < mass <= 1.0:
        raise InvalidInputError(f"mass must be a fraction in (0, 1], got {mass!r}")
    v = np.sort(_mass(values))[::-1]
    total = v.sum()
    if v.size == 0 or total <= 0:
        return float("nan")
    k = int(np.searchsorted(np.cumsum(v), mass * total * (1 - 1e-12), side="left")) + 1
    return min(k, v.size) / v.size


def _per_trace_and_pooled(
    traces: list[Trace], score: str, segment: str | None, pooled: bool = True
) -> list[tuple[str, np.ndarray]]:
    rows = [(_label(t, i), _values(t, score, segment)[1]) for i, t in enumerate(traces)]
    if pooled and rows:
        rows.append((POOLED, np.concatenate([v for _, v in rows])))
    return rows


def lorenz(
    traces: Trace | Sequence[Trace],
    score: str = DEFAULT_SCORE,
    pooled: bool = True,
    segment: str | None = None,
    max_points: int = 501,
) -> pd.DataFrame:
    """Lorenz curves per trace (and pooled): columns trace, x, y; at most `max_points` points each."""
    items = _prepare(traces, score, segment)
    frames = []
    for label, v in _per_trace_and_pooled(items, score, segment, pooled):
        x, y = lorenz_points(v)
        if x.size > max_points:
            keep = np.unique(np.linspace(0, x.size - 1, max_points).round().astype(int))
            x, y = x[keep], y[keep]
        frames.append(pd.DataFrame({"trace": label, "x": x, "y": y}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["trace", "x", "y"])


def gini_table(traces: Trace | Sequence[Trace], score: str = DEFAULT_SCORE, segment: str | None = None) -> pd.DataFrame:
    """Gini of the scores per trace and pooled: columns trace, n, gini."""
    items = _prepare(traces, score, segment)
    rows = [{"trace": label, "n": int(v.size), "gini": gini(v)} for label, v in _per_trace_and_pooled(items, score, segment)]
    return pd.DataFrame(rows, columns=["trace", "n", "gini"])


def mass_fraction(
    traces: Trace | Sequence[Trace], score: str = DEFAULT_SCORE, mass: float = 0.8, segment: str | None = None
) -> pd.DataFrame:
    """Share of tokens (highest first) holding `mass` of the score mass, per trace and pooled."""
    items = _prepare(traces, score, segment)
    rows = [
        {"trace": label, "n": int(v.size), "mass": mass, "fraction": mass_fraction_value(v, mass)}
        for label, v in _per_trace_and_pooled(items, score, segment)
    ]
    return pd.DataFrame(rows, columns=["trace", "n", "mass", "fraction"])


# -- where the spikes are -----------------------------------------------------------------------


def position_density(
    traces: Trace | Sequence[Trace],
    score: str = DEFAULT_SCORE,
    top: float = 0.01,
    bins: int = 20,
    segment: str | None = None,
) -> pd.DataFrame:
    """Histogram density over u = t/T of each trace's top-`top` tokens, against the uniform density 1.

    Columns bin_left, bin_right, count, density, uniform; density integrates to 1 over [0, 1].
    attrs["median_u"] and attrs["n"] hold the median position and the number of tokens counted.
    """
    items = _prepare(traces, score, segment)
    if not (isinstance(bins, int) and bins >= 1):
        raise InvalidInputError(f"bins must be a positive integer, got {bins!r}")
    us = []
    for t in items:
        _, v = _values(t, score, segment)
        if v.size:
            us.append(top_positions(v, top) / v.size)
    u = np.concatenate(us) if us else np.zeros(0)
    edges = np.linspace(0.0, 1.0, bins + 1)
    counts, _ = np.histogram(u, bins=edges)
    width = 1.0 / bins
    density = counts / (u.size * width) if u.size else np.full(bins, np.nan)
    df = pd.DataFrame(
        {"bin_left": edges[:-1], "bin_right": edges[1:], "count": counts, "density": density, "uniform": 1.0}
    )
    df.attrs["median_u"] = float(np.median(u)) if u.size else float("nan")
    df.attrs["n"] = int(u.size)
    return df


def entropy_iou(
    traces: Trace | Sequence[Trace],
    score: str = DEFAULT_SCORE,
    ps: Sequence[float] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5),
    segment: str | None = None,
) -> pd.DataFrame:
    """IoU of each trace's top-p% `score` tokens with its top-p% base-entropy tokens, pooled.

    Pooled as sum |A ∩ B| / sum |A ∪ B| over traces. Columns p, iou, n (sum |A|).
    """
    items = _prepare(traces, score, segment)
    rows = []
    for p in ps:
        inter = union = n = 0
        for t in items:
            _, s = _values(t, score, segment)
            _, h = _values(t, ENTROPY, segment)
            a, b = set(top_positions(s, p).tolist()), set(top_positions(h, p).tolist())
            inter += len(a & b)
            union += len(a | b)
            n += len(a)
        rows.append({"p": float(p), "iou": inter / union if union else float("nan"), "n": n})
    return pd.DataFrame(rows, columns=["p", "iou", "n"])


# -- planning-token enrichment ------------------------------------------------------------------


def _tags(trace: Trace) -> np.ndarray:
    """Per-token tags from annotations["tags"], else from the spaCy planning tagger."""
    tags = trace.annotations.get("tags")
    if tags is None:
        try:
            from core.planning import tag_planning  # lazy: spaCy is heavy and optional here
        except ImportError as exc:
            raise InvalidInputError(
                "trace has no 'tags' annotation and core.planning could not be imported; "
                "annotate tags first (trace.annotate(tags=[...]))"
            ) from exc
        tagged = tag_planning(trace)
        tags = tagged.annotations["tags"] if isinstance(tagged, Trace) else tagged
    tags = np.asarray(list(tags), dtype=object)
    if tags.size != len(trace):
        raise InvalidInputError(f"trace has {tags.size} tags for {len(trace)} tokens")
    return tags


PLANNING = "planning"  # pooled pseudo-category in `enrichment`


def enrichment(
    traces: Trace | Sequence[Trace], score: str = DEFAULT_SCORE, top: float = 0.01, segment: str | None = None
) -> pd.DataFrame:
    """Share of each tag category among all tokens, top-`top` score tokens, top entropy tokens and
    tokens taken over (source != "base"); enrichment = share / share among all tokens.

    Columns set, category, share, enrichment, n (category count in the set), size (set size). Besides
    each tag, category "planning" pools every non-execute tag (the paper's planning share).
    """
    items = _prepare(traces, score, segment)
    pools: dict[str, list[np.ndarray]] = {"all": [], "top_score": [], "top_entropy": [], "taken_over": []}
    for t in items:
        pos, s = _values(t, score, segment)
        _, h = _values(t, ENTROPY, segment)
        tags = _tags(t)[pos]
        source = np.asarray(t.source, dtype=object)[pos]
        pools["all"].append(tags)
        pools["top_score"].append(tags[top_positions(s, top)])
        pools["top_entropy"].append(tags[top_positions(h, top)])
        pools["taken_over"].append(tags[source != TAKEN_SOURCES_EXCLUDE])
    sets = {name: np.concatenate(parts) if parts else np.zeros(0, dtype=object) for name, parts in pools.items()}
    categories = sorted({str(c) for c in sets["all"]})
    if "execute" in categories and len(categories) > 1:
        categories.append(PLANNING)  # the paper's single planning share: every non-execute category

    def members(tags: np.ndarray, c: str) -> np.ndarray:
        return tags != "execute" if c == PLANNING else tags == c

    base_share = {c: float(np.mean(members(sets["all"], c))) for c in categories} if sets["all"].size else {}
    rows = []
    for name, tags in sets.items():
        for c in categories:
            n = int(members(tags, c).sum())
            share = n / tags.size if tags.size else float("nan")
            enr = share / base_share[c] if base_share.get(c) else float("nan")
            rows.append({"set": name, "category": c, "share": share, "enrichment": enr, "n": n, "size": int(tags.size)})
    return pd.DataFrame(rows, columns=["set", "category", "share", "enrichment", "n", "size"])


# -- failure prediction -------------------------------------------------------------------------

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


# -- is the reasoner's choice already in the base top-k? ------------------------------------------


def _rank_values(traces: list[Trace], at: str, score: str, segment: str | None) -> np.ndarray:
    if at not in RANK_AT:
        raise InvalidInputError(f"Unknown at={at!r}; choose one of: {', '.join(RANK_AT)}")
    parts = []
    for t in traces:
        pos = _view(t, segment)
        if at == "spikes":
            if "spikes" in t.annotations:
                pos = np.intersect1d(pos, spike_positions(t, score))
            else:
                _, s = _values(t, score, segment)
                pos = pos[top_positions(s, 0.01)]
        parts.append(np.asarray(t.metrics["reason_top_rank_in_base"], dtype=np.int64)[pos])
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def reason_rank(
    traces: Trace | Sequence[Trace],
    at: str = "all",
    score: str = DEFAULT_SCORE,
    segment: str | None = None,
    cap: int = 10,
) -> pd.DataFrame:
    """Histogram of the base rank of the reasoner's top token (0 = base agrees), at all tokens or spikes.

    Spikes are the annotated ones, else each trace's top 1% by `score`. Ranks >= `cap` share the last
    bucket. Columns rank, label, count, share, cum_share (cum_share at rank k-1 = share within top-k).
    """
    items = _prepare(traces, score, segment)
    r = _rank_values(items, at, score, segment)
    counts = np.bincount(np.clip(r, 0, cap), minlength=cap + 1)[: cap + 1]
    total = counts.sum()
    share = counts / total if total else np.full(cap + 1, np.nan)
    labels = [str(k) for k in range(cap)] + [f">={cap}"]
    return pd.DataFrame(
        {"rank": np.arange(cap + 1), "label": labels, "count": counts, "share": share, "cum_share": np.cumsum(share)}
    )


def reason_rank_within(
    traces: Trace | Sequence[Trace], score: str = DEFAULT_SCORE, ks: Sequence[int] = (1, 5, 10), segment: str | None = None
) -> pd.DataFrame:
    """Share of positions whose reasoner top token is within the base top-k: columns at, k, share, n."""
    items = _prepare(traces, score, segment)
    rows = []
    for at in RANK_AT:
        r = _rank_values(items, at, score, segment)
        for k in ks:
            rows.append({"at": at, "k": int(k), "share": float(np.mean(r < k)) if r.size else float("nan"), "n": int(r.size)})
    return pd.DataFrame(rows, columns=["at", "k", "share", "n"])


# -- decision pairs -----------------------------------------------------------------------------

DECISION_COLUMNS = [
    "trace", "pos", "prefix", "emitted_id", "emitted_text", "source",
    "base_id", "base_text", "reason_id", "reason_text",
    "p_base_base", "p_base_reason", "p_reason_base", "p_reason_reason",
    "reason_top_rank_in_base", "score_name", "score",
]  # fmt: skip


def _prob_of(ids: np.ndarray, probs: np.ndarray, token: int) -> float:
    hit = np.flatnonzero(ids == token)
    return float(probs[hit[0]]) if hit.size else float("nan")


def decision_pairs(
    traces: Trace | Sequence[Trace],
    tokenizer_decode: Callable[[list[int]], str] | None = None,
    score: str = DEFAULT_SCORE,
    top: float = 0.01,
    segment: str | None = None,
) -> pd.DataFrame:
    """One row per spike (annotated, else top-`top` by `score`): the base's and the reasoner's choice.

    base/reason token = argmax of each model's top-k; p_<model>_<choice> is that model's probability
    of that choice (NaN when outside the model's top-k). Texts come from `tokenizer_decode([id])`
    when given; without it only a choice equal to the emitted token gets its text (else None).
    """
    items = _prepare(traces, score, segment)
    rows = []
    for i, t in enumerate(items):
        view = _view(t, segment)
        if "spikes" in t.annotations:
            pos_list = np.intersect1d(view, spike_positions(t, score))
        else:
            pos_list = view[top_positions(_values(t, score, segment)[1], top)]
        values = np.asarray(score_values(t.metrics, score), dtype=np.float64)
        ids_b, probs_b = (np.asarray(a) for a in t.topk["base"])
        ids_r, probs_r = (np.asarray(a) for a in t.topk["reason"])
        for pos in pos_list.tolist():
            base_id = int(ids_b[pos][np.argmax(probs_b[pos])])
            reason_id = int(ids_r[pos][np.argmax(probs_r[pos])])
            emitted = int(t.token_ids[pos])

            def text(tok: int) -> str | None:
                if tokenizer_decode is not None:
                    return tokenizer_decode([tok])
                return t.tokens[pos] if tok == emitted else None

            rows.append({
                "trace": _label(t, i), "pos": pos, "prefix": "".join(t.tokens[:pos]),
                "emitted_id": emitted, "emitted_text": t.tokens[pos], "source": str(t.source[pos]),
                "base_id": base_id, "base_text": text(base_id),
                "reason_id": reason_id, "reason_text": text(reason_id),
                "p_base_base": _prob_of(ids_b[pos], probs_b[pos], base_id),
                "p_base_reason": _prob_of(ids_b[pos], probs_b[pos], reason_id),
                "p_reason_base": _prob_of(ids_r[pos], probs_r[pos], base_id),
                "p_reason_reason": _prob_of(ids_r[pos], probs_r[pos], reason_id),
                "reason_top_rank_in_base": int(t.metrics["reason_top_rank_in_base"][pos]),
                "score_name": score, "score": float(values[pos]),
            })  # fmt: skip
    return pd.DataFrame(rows, columns=DECISION_COLUMNS)


def write_decision_pairs_jsonl(df: pd.DataFrame, path: str, overwrite: bool = False) -> str:
    """Write decision pairs one JSON object per line (NaN -> null); refuses to overwrite unless asked."""
    if os.path.exists(path) and not overwrite:
        raise ForkpointError(f"{path} exists; pass overwrite=True to replace it")
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        for record in df.to_dict(orient="records"):
            clean = {k: _jsonable(v) for k, v in record.items()}
            fh.write(json.dumps(clean, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    log.info("wrote %d decision pairs to %s", len(df), path)
    return path


def _jsonable(v: object) -> object:
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v
