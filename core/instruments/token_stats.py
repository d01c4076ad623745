"""Which tokens carry disagreement across a dataset: per token string (or planning category) counts,
scores, spike and takeover rates and measured effects; and the occurrences behind one row.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from core import settings
from core.annotate.spikes import spikes_or_top
from core.errors import InvalidInputError
from core.scoring.registry import check_score, score_values
from core.trace import TAKEOVER_SOURCE, Trace

BY = ("token", "tag")  # group by the token's display string, or by its planning category
TOKEN_STATS_COLUMNS = ["count", "traces", "mean_score", "max_score", "spike_rate", "takeover_rate", "mean_effect", "n_effects"]
OCCURRENCE_COLUMNS = ["trace", "index", "pos", "token", "tag", "score", "spike", "source", "effect"]


def _check_by(by: str) -> str:
    if by not in BY:
        raise InvalidInputError(f"Unknown by={by!r}; choose one of: {', '.join(BY)}")
    return by


def _tags(trace: Trace) -> list[str]:
    from core.annotate.planning import trace_tags  # spaCy: heavy, loaded only when grouping by tag

    return trace_tags(trace)


def occurrence_frame(traces: Sequence[Trace], *, score: str | None = None, by: str = "token",
                     effects: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per token of every trace: trace (key), index (in `traces`), pos, token, tag (when by='tag'),
    score, spike (the trace's spikes, or its top 1% above the floor), source, effect (where measured)."""
    score = check_score(score or settings.SCORE)
    _check_by(by)
    measured = _effects(effects)
    cols: dict[str, list[Any]] = {c: [] for c in OCCURRENCE_COLUMNS}  # one frame at the end, not one per trace
    for i, trace in enumerate(traces):
        n = len(trace)
        spike = np.zeros(n, dtype=bool)
        spike[spikes_or_top(trace, score)] = True
        effect = np.full(n, np.nan)
        for pos, value in measured.get(str(trace.key), {}).items():
            if 0 <= pos < n:
                effect[pos] = value
        cols["trace"].append([trace.key] * n)
        cols["index"].append(np.full(n, i, dtype=np.int64))
        cols["pos"].append(np.arange(n))
        cols["token"].append(list(trace.tokens))
        cols["tag"].append(_tags(trace) if by == "tag" else [""] * n)
        cols["score"].append(np.asarray(score_values(trace.metrics, score), dtype=np.float64))
        cols["spike"].append(spike)
        cols["source"].append([str(s) for s in trace.source])
        cols["effect"].append(effect)
    if not cols["pos"]:
        return pd.DataFrame({c: [] for c in OCCURRENCE_COLUMNS})
    listed = ("trace", "token", "tag", "source")
    return pd.DataFrame({c: [x for part in parts for x in part] if c in listed else np.concatenate(parts)
                         for c, parts in cols.items()})


def check_effects(effects: pd.DataFrame, where: str = "effects") -> pd.DataFrame:
    """`effects` with numeric pos and effect columns, or InvalidInputError naming `where` and what is wrong: a
    missing column (trace, pos, effect: `takeover_effects` rows), a pos that is not a whole number, an effect
    that is not a number (an empty effect is a missing measurement)."""
    missing = {"trace", "pos", "effect"} - set(effects.columns)
    if missing:
        raise InvalidInputError(f"{where} needs the columns trace, pos and effect (from takeover_effects, as "
                                f"`forkpoint effects` writes them); missing: {', '.join(sorted(missing))}")
    pos = pd.to_numeric(effects["pos"], errors="coerce")
    effect = pd.to_numeric(effects["effect"], errors="coerce")
    _refuse(effects["pos"], pos.isna() | (pos % 1 != 0), f"{where}: a pos that is not a whole number")
    _refuse(effects["effect"], effect.isna() & effects["effect"].notna(), f"{where}: an effect that is not a number")
    return effects.assign(pos=pos.astype(np.int64), effect=effect)


def _refuse(values: pd.Series, bad: pd.Series, what: str) -> None:
    if bad.any():
        first = int(np.flatnonzero(bad.to_numpy())[0])
        raise InvalidInputError(f"{what} in {int(bad.sum())} row(s) (first: {values.iloc[first]!r} in data row "
                                f"{first + 1})")


def read_effects(path: str | Path) -> pd.DataFrame:
    """An effects table from a CSV file (`forkpoint effects --out`), checked by `check_effects`; InvalidInputError
    naming the file when it cannot be read as a CSV (empty, malformed) or is not an effects table."""
    try:
        table = pd.read_csv(path, dtype={"trace": str})
    except (OSError, ValueError) as err:  # pandas' EmptyDataError and ParserError are ValueErrors
        raise InvalidInputError(f"cannot read an effects table from {path}: {' '.join(str(err).split())}") from err
    return check_effects(table, str(path))


def _effects(effects: pd.DataFrame | None) -> dict[str, dict[int, float]]:
    """trace key -> {pos: mean effect} from `takeover_effects` rows (several runs of a position average)."""
    if effects is None or effects.empty:
        return {}
    effects = check_effects(effects)
    out: dict[str, dict[int, float]] = {}
    for (key, pos), value in effects.groupby(["trace", "pos"])["effect"].mean().items():
        out.setdefault(str(key), {})[int(pos)] = float(value)
    return out


def token_stats(traces: Sequence[Trace], *, score: str | None = None, by: str = "token",
                effects: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per token string (by='token') or planning category (by='tag'), most frequent first: count,
    traces (how many it occurs in), mean_score, max_score, spike_rate, takeover_rate (share the reasoner
    wrote), mean_effect and n_effects (over occurrences whose effect was measured, from
    `takeover_effects` frames)."""
    occ = occurrence_frame(traces, score=score, by=by, effects=effects)
    if occ.empty:
        return pd.DataFrame(columns=[by, *TOKEN_STATS_COLUMNS])
    occ = occ.assign(takeover=occ["source"] == TAKEOVER_SOURCE)
    grouped = occ.groupby(by, sort=False)
    out = pd.DataFrame({
        "count": grouped.size(), "traces": grouped["index"].nunique(),
        "mean_score": grouped["score"].mean(), "max_score": grouped["score"].max(),
        "spike_rate": grouped["spike"].mean(), "takeover_rate": grouped["takeover"].mean(),
        "mean_effect": grouped["effect"].mean(), "n_effects": grouped["effect"].count(),
    })
    out = out.rename_axis(by).reset_index()
    return out.sort_values(["count", "mean_score"], ascending=[False, False], kind="stable").reset_index(drop=True)


def occurrences(traces: Sequence[Trace], value: Any, *, by: str = "token", score: str | None = None,
                effects: pd.DataFrame | None = None) -> pd.DataFrame:
    """The occurrences behind one `token_stats` row: every (trace, pos) whose token (or tag) is `value`."""
    occ = occurrence_frame(traces, score=score, by=by, effects=effects)
    return occ[occ[_check_by(by)] == value].reset_index(drop=True)
