"""Which of a child's forced tokens the user typed: `meta["typed"]`, the one reader `typed_runs`.

A switch to given tokens is either typed text (a string, or a list of ids: the app's edit) or one token id
(a hover-card alternative). Both become forced token ids in `meta["switches"]` (so the store key, made from
the switches, is the same for the same tokens however they were asked for); `meta["typed"]` (outside the
key) keeps which runs of them were typed: `{str(start): n_tokens}`.
"""

from __future__ import annotations

from typing import Any

from core.trace import Trace


def typed_runs(trace: Trace) -> dict[int, int]:
    """The typed runs among `trace`'s switches in force, `{start: n_tokens}`. A record made before typed runs
    were recorded (no `meta["typed"]`) reads as it was shown then: a run of two or more forced token ids at
    consecutive positions is typed text, a lone one a forced token."""
    meta = trace.meta
    if "typed" in meta:
        return {int(p): int(n) for p, n in (meta.get("typed") or {}).items()}
    forced = sorted(int(p) for p, w in (meta.get("switches") or {}).items() if _is_id(w))
    runs: dict[int, int] = {}
    start = None
    for i, p in enumerate(forced):
        if start is None or p != forced[i - 1] + 1:
            start = p
            runs[start] = 0
        runs[start] += 1
    return {p: n for p, n in runs.items() if n > 1}


def _is_id(what: Any) -> bool:
    return isinstance(what, int) and not isinstance(what, bool)
