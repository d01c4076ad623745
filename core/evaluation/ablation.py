"""Which takeovers matter: switch each of a trace's takeovers off in turn and see whether the answer holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from core.decoding.takeover import set_switches, switches_in_force
from core.evaluation.grading import graded_put
from core.pair.loading import ModelPair
from core.trace import Trace

COLUMNS = ["pos", "token", "answer", "correct", "same_answer", "n_tokens", "key"]


def ablate_takeovers(pair: ModelPair, trace: Trace, *, store: Any = None,
                     progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """One row per takeover of `trace` (a token not written by the base): the trace with that takeover switched
    off (every other switch kept, the trace's policy deciding after it), its graded answer, and whether the
    answer is the original's. Each child is stored when `store` is given, so a rerun reuses it."""
    graded_put(None, trace)
    positions = [i for i, s in enumerate(trace.source) if str(s) != "base"]
    kept = switches_in_force(trace)
    rows = []
    for done, pos in enumerate(positions):
        child = set_switches(pair, trace, {**kept, pos: "base"}, store=store)
        child = graded_put(store, child)
        answer = child.meta.get("answer")
        rows.append({"pos": pos, "token": trace.tokens[pos], "answer": answer, "correct": child.meta.get("correct"),
                     "same_answer": answer == trace.meta.get("answer"), "n_tokens": len(child), "key": child.key})
        if progress is not None:
            progress(done + 1, len(positions))
    return pd.DataFrame(rows, columns=COLUMNS)
