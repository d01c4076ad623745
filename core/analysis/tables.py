"""The seed paper's analyses as pure functions: lists of traces in, tidy DataFrames out.

Every function takes `score=` (a name from `core.scoring.registry.SCORES`) and `segment=None|"think"|
"answer"`: with a segment, a trace that carries annotations["segments"] is cut to the positions of
that segment (and analysed as if that were the whole response); a trace without the layer is kept
whole. Figures live in `core.reports.report`; failure prediction in `failure`, decision pairs in
`decisions` (both re-exported here).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pandas as pd

from core import settings
from core.analysis.decisions import (  # noqa: F401
    DECISION_COLUMNS,
    decision_pairs,
    write_decision_pairs_jsonl,
)
from core.analysis.failure import (  # noqa: F401
    auroc,
    failure_auroc,
    roc_curve,
    roc_points,
    trace_stat,
)
from core.analysis.views import ENTROPY, POOLED, SEGMENTS  # noqa: F401
from core.analysis.views import as_list as _as_list  # noqa: F401
from core.analysis.views import label as _label
from core.analysis.views import prepare as _prepare
from core.analysis.views import values as _values  # noqa: F401
from core.analysis.views import view as _view
from core.annotate.spikes import spikes_or_top, top_positions
from core.errors import InvalidInputError
from core.scoring.registry import DEFAULT_SCORE, check_score, score_values
from core.trace import TAKEOVER_SOURCE, Trace

log = logging.getLogger(__name__)

RANK_AT = ("all", "spikes")


def first_token_artifact(trace: Trace, score: str = DEFAULT_SCORE) -> bool:
    """Whether t = 0 is the trace's largest spike (strictly above every later score): the sign of a
    prompt-format artefact, e.g. a thinking reasoner whose assistant turn did not open its thought
    (use a `+think` prompt format). False for traces of fewer than two tokens."""
    check_score(score)
    v = np.asarray(score_values(trace.metrics, score), dtype=np.float64).reshape(-1)
    if v.size < 2 or not np.isfinite(v[0]):
        return False
    rest = v[1:][~np.isnan(v[1:])]
    return bool(rest.size == 0 or v[0] > rest.max())


def first_token_artifact_share(traces: Sequence[Trace], score: str = DEFAULT_SCORE) -> float:
    """Share of traces (of ≥ 2 tokens) whose largest spike is at t = 0 (see `first_token_artifact`)."""
    found = [first_token_artifact(t, score) for t in _as_list(traces) if len(t) >= 2]  # one trace at a time
    return float(np.mean(found)) if found else float("nan")


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
    labels, xs, ys = [], [], []
    for label, v in _per_trace_and_pooled(items, score, segment, pooled):
        x, y = lorenz_points(v)
        if x.size > max_points:
            keep = np.unique(np.linspace(0, x.size - 1, max_points).round().astype(int))
            x, y = x[keep], y[keep]
        labels.append(label)
        xs.append(x)
        ys.append(y)
    if not labels:
        return pd.DataFrame(columns=["trace", "x", "y"])
    return pd.DataFrame({"trace": np.repeat(np.array(labels, dtype=object), [x.size for x in xs]),
                         "x": np.concatenate(xs), "y": np.concatenate(ys)})


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
    top: float = settings.SPIKE_TOP,
    bins: int = 20,
    segment: str | None = None,
) -> pd.DataFrame:
    """Histogram density over u = t/T of each trace's top-`top` tokens, against the uniform density 1.

    Columns bin_left, bin_right, count, density, uniform; density integrates to 1 over [0, 1].
    attrs["median_u"], attrs["peak_u"] (centre of the densest bin, the earliest on a tie) and attrs["n"]
    hold the median position, the density's peak location and the number of tokens counted.
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
    df.attrs["peak_u"] = float((edges[:-1] + width / 2)[int(np.argmax(counts))]) if u.size else float("nan")
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
            from core.annotate.planning import (
                tag_planning,  # lazy: spaCy is heavy and optional here
            )
        except ImportError as exc:
            raise InvalidInputError(
                "trace has no 'tags' annotation and core.annotate.planning could not be imported; "
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
    traces: Trace | Sequence[Trace], score: str = DEFAULT_SCORE, top: float = settings.SPIKE_TOP, segment: str | None = None,
    taken: Sequence[Trace] | None = None,
) -> pd.DataFrame:
    """Share of each tag category among all tokens, top-`top` score tokens, top entropy tokens and
    tokens taken over (written by the reasoner); enrichment = share / share among all tokens.

    With `taken` (e.g. Guided's traces), the taken-over set is read from those and every other set from
    `traces` alone (e.g. the base's own rollouts), as the paper does; without, all sets come from `traces`.
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
        if taken is None:
            pools["taken_over"].append(tags[source == TAKEOVER_SOURCE])
    for t in _prepare(taken, score, segment) if taken is not None else ():
        pos, _ = _values(t, score, segment)
        pools["taken_over"].append(_tags(t)[pos][np.asarray(t.source, dtype=object)[pos] == TAKEOVER_SOURCE])
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


# -- is the reasoner's choice already in the base top-k? ------------------------------------------


def _rank_values(traces: list[Trace], at: str, score: str, segment: str | None) -> np.ndarray:
    if at not in RANK_AT:
        raise InvalidInputError(f"Unknown at={at!r}; choose one of: {', '.join(RANK_AT)}")
    parts = []
    for t in traces:
        pos = _view(t, segment)
        if at == "spikes":
            if "spikes" in t.annotations:
                pos = np.intersect1d(pos, spikes_or_top(t, score))
            else:
                _, s = _values(t, score, segment)
                pos = pos[top_positions(s, settings.SPIKE_TOP)]
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
