"""Which takeovers matter: switch each of a trace's takeovers off in turn and see whether the answer holds."""

from __future__ import annotations

from typing import Any

import pandas as pd

from core.decoding.takeover import set_switches_many, switches_in_force
from core.evaluation.grading import graded_put
from core.pair.loading import ModelPair
from core.settings import Progress
from core.trace import Trace

ABLATION_COLUMNS = ["pos", "token", "answer", "correct", "same_answer", "n_tokens", "key"]


def ablation_switches(trace: Trace) -> list[tuple[int, dict[int, int | str]]]:
    """Per takeover of `trace` (a token the reasoner wrote; a forced one is the user's, not a takeover): its
    position and the switches with it switched off (the base writes there; every other switch kept, the trace's policy deciding after it)."""
    kept = switches_in_force(trace)
    return [(i, {**kept, i: "base"}) for i, s in enumerate(trace.source) if str(s) == "reason"]


def ablate_takeovers(pair: ModelPair, trace: Trace, *, store: Any = None,
                     progress: Progress | None = None) -> pd.DataFrame:
    """One row per takeover of `trace`: the trace with that takeover switched off (`ablation_switches`),
    its graded answer, and whether the answer is the original's. All the variants are decoded together in
    one batch; each child is stored when `store` is given, so a rerun reuses it."""
    graded_put(None, trace)
    wanted = ablation_switches(trace)
    if not wanted:
        return pd.DataFrame([], columns=ABLATION_COLUMNS)
    n = len(wanted)

    def step(t: int, limit: int) -> None:  # the batch's decoding position, as a share of the takeovers
        if progress is not None:
            progress(min(n - 1, n * t // max(limit, 1)), n)

    children = set_switches_many(pair, trace, [w for _, w in wanted], store=store, progress=step)
    rows = []
    for (pos, _), child in zip(wanted, children):
        child = graded_put(store, child)
        answer = child.meta.get("answer")
        rows.append({"pos": pos, "token": trace.tokens[pos], "answer": answer, "correct": child.meta.get("correct"),
                     "same_answer": answer == trace.meta.get("answer"), "n_tokens": len(child), "key": child.key})
    if progress is not None:
        progress(n, n)
    return pd.DataFrame(rows, columns=ABLATION_COLUMNS)
