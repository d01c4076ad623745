"""Search across traces: where a string or a regular expression occurs in every stored response, with the
score, spike and tag status of the tokens it covers and the trace's outcome ("where does ' Wait' disagree?").

Pure over the store: it reads traces and writes nothing. A match is found in the response text (the tokens
joined), so a pattern may span tokens; each match becomes one row at the token where it starts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from core import settings
from core.annotate.spikes import spikes_or_top
from core.errors import InvalidInputError
from core.scoring.registry import check_score, score_values
from core.trace import Trace
from core.views.presentation import policy_text

SEARCH_COLUMNS = ["key", "problem", "pos", "end", "match", "token", "score", "spike", "tag", "source", "correct",
                  "answer", "policy", "n_tokens"]
MAX_PATTERN = 500  # characters: a longer pattern is a mistake, and a long regex can be slow


def compile_pattern(pattern: str, *, regex: bool = False, case: bool = True) -> re.Pattern[str]:
    """The pattern to look for: `pattern` literally, or as a regular expression (InvalidInputError naming it
    when it does not compile or is empty)."""
    text = str(pattern)
    if not text:
        raise InvalidInputError("Give a non-empty search pattern")
    if len(text) > MAX_PATTERN:
        raise InvalidInputError(f"The search pattern has {len(text)} characters; at most {MAX_PATTERN}")
    try:
        return re.compile(text if regex else re.escape(text), 0 if case else re.IGNORECASE)
    except re.error as err:
        raise InvalidInputError(f"pattern {text!r} is not a valid regular expression: {err}") from None


def trace_matches(trace: Trace, pattern: re.Pattern[str], *, score: str = settings.SCORE,
                  top: float = settings.SPIKE_TOP, tags: bool = False) -> list[dict[str, Any]]:
    """Each match of `pattern` in one trace's response: pos..end (the tokens it covers, inclusive), the
    matched text, the first token, the highest score over the covered tokens, whether any of them is a
    spike (the trace's spikes, else its top `top`), its first tagged category, who wrote the first token."""
    n = len(trace)
    if n == 0:
        return []
    starts = np.cumsum([0] + [len(t) for t in trace.tokens])  # (n+1,) character offset of each token
    text = "".join(trace.tokens)
    values = np.asarray(score_values(trace.metrics, score), dtype=np.float64)
    spiked = np.zeros(n, dtype=bool)
    spiked[spikes_or_top(trace, score, top)] = True
    layer = _tags(trace) if tags else None
    meta = trace.meta
    rows = []
    for m in pattern.finditer(text):
        if m.end() == m.start():  # an empty match (e.g. `a*`) covers no token
            continue
        pos = int(np.searchsorted(starts, m.start(), side="right") - 1)
        end = max(pos, int(np.searchsorted(starts, m.end(), side="left") - 1))
        covered = values[pos : end + 1]
        finite = covered[np.isfinite(covered)]
        tagged = [t for t in (layer[pos : end + 1] if layer else []) if t and t not in ("execute", "none")]
        rows.append({
            "key": trace.key, "problem": (meta.get("problem") or {}).get("id"), "pos": pos, "end": end,
            "match": m.group(0), "token": trace.tokens[pos], "score": float(finite.max()) if finite.size else np.nan,
            "spike": bool(spiked[pos : end + 1].any()), "tag": tagged[0] if tagged else "",
            "source": str(trace.source[pos]), "correct": meta.get("correct"), "answer": meta.get("answer"),
            "policy": policy_text((meta.get("policy") or {}).get("name"), meta.get("kind"), meta.get("parent")),
            "n_tokens": n,
        })  # fmt: skip
    return rows


def _tags(trace: Trace) -> list[str]:
    from core.annotate.planning import trace_tags  # spaCy: heavy, only when tags are asked for

    return trace_tags(trace)


def search_traces(traces: Iterable[Trace], pattern: str, *, regex: bool = False, case: bool = True,
                  score: str | None = None, top: float = settings.SPIKE_TOP, tags: bool = False,
                  spikes_only: bool = False, limit: int | None = None) -> pd.DataFrame:
    """Every match of `pattern` (literal, or a regular expression) in `traces`, one row each (SEARCH_COLUMNS),
    by trace then position; `spikes_only` keeps the matches on a spike; `limit` caps the rows."""
    score = check_score(score or settings.SCORE)
    compiled = compile_pattern(pattern, regex=regex, case=case)
    if limit is not None and int(limit) < 1:
        raise InvalidInputError(f"limit must be at least 1, got {limit}")
    rows: list[dict[str, Any]] = []
    for trace in traces:
        found = trace_matches(trace, compiled, score=score, top=top, tags=tags)
        rows += [r for r in found if r["spike"]] if spikes_only else found
        if limit is not None and len(rows) >= limit:
            rows = rows[: int(limit)]
            break
    return pd.DataFrame(rows, columns=SEARCH_COLUMNS)


def search_store(store: Any, pattern: str, **options: Any) -> pd.DataFrame:
    """`search_traces` over every readable trace of a TraceStore (unreadable files are skipped; the store's
    `unreadable()` lists them)."""
    traces, _bad = store.load_all()
    return search_traces(traces, pattern, **options)


def spiking_keys(found: pd.DataFrame) -> list[str]:
    """The traces where a search's matches spike (for filtering a trace table), in first-seen order."""
    if found.empty:
        return []
    return list(dict.fromkeys(found.loc[found["spike"].astype(bool), "key"].astype(str)))
