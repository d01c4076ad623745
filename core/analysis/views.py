"""What the analyses look at in a trace: the positions of a segment ("think" / "answer" / all) and the
score values there. Shared by `tables`, `failure` and `decisions`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from core.errors import InvalidInputError
from core.scoring.registry import check_score, score_values
from core.trace import Trace

SEGMENTS = (None, "think", "answer")  # None: the whole response
POOLED = "pooled"
ENTROPY = "entropy_base"



def check_segment(segment: str | None) -> None:
    """Raise unless `segment` is one of SEGMENTS."""
    if segment not in SEGMENTS:
        raise InvalidInputError(f"Unknown segment {segment!r}; choose one of: None, think, answer")


def as_list(traces: Trace | Sequence[Trace]) -> Sequence[Trace]:
    """One trace or many, as a sequence. A sequence is kept as it is, so a lazy one (`StoredTraces`: keys,
    each trace read from the store when used) stays lazy: an analysis holds one trace at a time, never all."""
    if isinstance(traces, Trace):
        return [traces]
    return traces if isinstance(traces, Sequence) else list(traces)


def label(trace: Trace, i: int) -> str:
    """A trace's name in tables: its store key, else its index."""
    return trace.key or f"trace{i}"


def view(trace: Trace, segment: str | None) -> np.ndarray:
    """Positions (sorted int64) of the trace that the analysis looks at."""
    if segment is None or "segments" not in trace.annotations:
        return np.arange(len(trace), dtype=np.int64)
    segs = np.asarray(trace.annotations["segments"], dtype=object)
    return np.flatnonzero(segs == segment).astype(np.int64)


def values(trace: Trace, score: str, segment: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(positions, score values at those positions) for one trace."""
    pos = view(trace, segment)
    vals = np.asarray(score_values(trace.metrics, score), dtype=np.float64).reshape(-1)
    return pos, vals[pos]


def prepare(traces: Trace | Sequence[Trace], score: str, segment: str | None) -> Sequence[Trace]:
    """Validate `score` and `segment`; the traces as a sequence (`as_list`)."""
    check_score(score)
    check_segment(segment)
    return as_list(traces)
