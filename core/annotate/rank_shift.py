"""Rank-shift categories: where the reasoner's top token sits in the base's ranking, per token.

From the alignment token-distribution-shift work: a token is *unshifted* when the reasoner's top token
is also the base's top token (base rank 1), *marginal* when it is the base's 2nd or 3rd choice, and
*shifted* when it ranks below 3rd. Read off the `reason_top_rank_in_base` metric (0 = top), so no model
is run. The "shifted ratio" is the share of tokens that are shifted. This module is the one home of
the categories, their colours, and the per-trace / per-dataset / at-spikes-and-takeovers tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from core import settings
from core.annotate.spikes import top_positions
from core.errors import InvalidInputError
from core.scoring import registry
from core.scoring.registry import DEFAULT_SCORE, score_values
from core.trace import Trace

# The categories are defined beside the metric they read (core/scoring/registry.py); this module draws and counts them.
NAME, METRIC, CATEGORIES, UNKNOWN = registry.RANK_SHIFT, registry.RANK_SHIFT_METRIC, registry.RANK_SHIFT_CATEGORIES, registry.RANK_SHIFT_UNKNOWN

categorise = registry.rank_shift_category

# Categorical colours (light enough for black text): green = base agrees, amber = close call, red = shifted.
COLOURS = {"unshifted": "#dcfce7", "marginal": "#fde68a", "shifted": "#fca5a5", UNKNOWN: "transparent"}
LABELS = {
    "unshifted": "unshifted (reasoner's top = base's top)",
    "marginal": "marginal (base's 2nd-3rd)",
    "shifted": "shifted (below base's 3rd)",
}
GROUPS = ("all tokens", "spikes", "takeovers")  # rows of `at_positions`


def rank_shift(trace: Trace) -> np.ndarray:
    """(T,) rank-shift category of each token of `trace`."""
    if METRIC not in trace.metrics:
        raise InvalidInputError(f"The trace has no {METRIC!r} metric; rank-shift categories need it")
    return categorise(trace.metrics[METRIC])


def colours(trace: Trace) -> list[str]:
    """(T,) css background colours of the categorical rank-shift heatmap."""
    return [COLOURS[c] for c in rank_shift(trace)]


def counts(categories: Any) -> dict[str, int]:
    """{category: count} over the known categories (unknown tokens are left out)."""
    cats = np.asarray(categories, dtype=object)
    return {c: int(np.count_nonzero(cats == c)) for c in CATEGORIES}


def ratio(counts_: dict[str, int], which: str = "shifted") -> float:
    """Share of `which` among the known tokens (NaN when there are none)."""
    if which not in CATEGORIES:
        raise InvalidInputError(f"Unknown rank-shift category {which!r}; choose one of: {', '.join(CATEGORIES)}")
    total = sum(counts_.values())
    return counts_[which] / total if total else float("nan")


def shifted_ratio(traces: Trace | Iterable[Trace], positions: Sequence[int] | None = None) -> float:
    """Share of shifted tokens in one trace (optionally only at `positions`) or pooled over many traces."""
    if isinstance(traces, Trace):
        cats = rank_shift(traces)
        if positions is not None:
            cats = cats[np.asarray(list(positions), dtype=np.int64)] if len(positions) else cats[:0]
        return ratio(counts(cats))
    if positions is not None:
        raise InvalidInputError("positions= applies to one trace, not to a list of traces")
    pooled = {c: 0 for c in CATEGORIES}
    for trace in traces:
        for c, n in counts(rank_shift(trace)).items():
            pooled[c] += n
    return ratio(pooled)


def _row(cats: np.ndarray) -> dict[str, Any]:
    c = counts(cats)
    total = sum(c.values())
    row: dict[str, Any] = {"n": total, **c}
    for name in CATEGORIES:
        row[f"{name}_share"] = c[name] / total if total else float("nan")
    return row


def per_trace_table(traces: Sequence[Trace]) -> pd.DataFrame:
    """One row per trace: key, n, counts per category and their shares (shifted_share = the shifted ratio)."""
    rows = [{"key": t.key, **_row(rank_shift(t))} for t in traces]
    return pd.DataFrame(rows, columns=["key", "n", *CATEGORIES, *(f"{c}_share" for c in CATEGORIES)])


def at_positions(traces: Sequence[Trace], score: str | None = None, top: float | None = None) -> pd.DataFrame:
    """Categories over all tokens, at spikes and at takeovers (tokens the reasoner wrote), pooled over `traces`:
    one row per group with n, counts and shares. Spikes are each trace's top-`top` tokens by `score` when
    `top` is given, else its spike layer. The ReasonMaxxer claim is that at spikes/takeovers the
    reasoner's pick is mostly unshifted or marginal (already in the base's top few)."""

    pooled: dict[str, list[np.ndarray]] = {g: [] for g in GROUPS}
    for trace in traces:
        cats = rank_shift(trace)
        if top is not None:
            spikes = top_positions(np.asarray(score_values(trace.metrics, score or DEFAULT_SCORE)), top,
                                   settings.SPIKE_FLOOR)  # the rule `core.spikes` applies
        else:
            spikes = np.asarray(trace.spike_positions, dtype=np.int64)
        pooled["all tokens"].append(cats)
        pooled["spikes"].append(cats[np.asarray(spikes, dtype=np.int64)])
        pooled["takeovers"].append(cats[trace.takeovers])
    rows = []
    for group in GROUPS:
        cats = np.concatenate(pooled[group]) if pooled[group] else np.zeros(0, dtype=object)
        rows.append({"group": group, **_row(cats)})
    return pd.DataFrame(rows)


def legend_items() -> str:
    """The three categories as legend chips (static text: nothing from a model)."""
    items = "".join(
        f'<span class="fp-heatmap"><span class="tok" style="background:{COLOURS[c]}">{LABELS[c]}</span></span>'
        for c in CATEGORIES
    )
    return f"<span>rank shift of the reasoner's top token:</span>{items}"


def swatches_html() -> str:
    """A small legend of the three categories."""
    return f'<div class="fp-legend">{legend_items()}</div>'
