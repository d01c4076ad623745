"""Where is success decided? P(correct | the trace's first t tokens) along a trace, and its pivotal tokens.

P(correct | prefix t) is estimated from the base's continuations at t (the child-trace kernel, through
`core.instruments.effects._continue`), evaluated where Pivotal Token Search (Phi-4 report; codelion/pts)
would: both ends, then the middle of every segment whose ends differ by at least `threshold`, down to single
tokens. The tokens across which the curve jumps by `threshold` or more are the pivotal tokens. Like PTS, it
misses two jumps that cancel inside one segment. Every continuation is a child trace (kept in the store
when one is given, so a re-run decodes nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from core import settings
from core.decoding.sampling import sample_seeds
from core.errors import InvalidInputError
from core.evaluation.grading import grade_trace
from core.instruments.effects import INTERVAL, _check, _continue, _correct, resolve_temperature
from core.instruments.intervals import spearman, wilson
from core.pair.loading import ModelPair
from core.scoring.registry import check_score, score_values
from core.settings import Progress
from core.trace import Trace

CURVE_COLUMNS = ["trace", "pos", "token", "p", "ci_low", "ci_high", "n", "jump", "pivotal", "score", "interval"]
PIVOT_THRESHOLD = 0.2  # PTS's default: a segment is split while its ends differ by this much


def success_curve(pair: ModelPair, trace: Trace, samples: int = settings.EFFECT_SAMPLES, *, temperature: float | None = None,
                  seed: int = settings.SEED, threshold: float = PIVOT_THRESHOLD, score: str = settings.SCORE, store: Any = None,
                  max_new_tokens: int | None = None, progress: Progress | None = None,
                  should_stop: Callable[[], bool] | None = None) -> pd.DataFrame:
    """P(correct | the first t tokens) at the t that Pivotal Token Search visits (see the module docstring).

    One row per visited t, in order: token (the token at t, the next one written), p with its Wilson 95%
    interval from n base continuations at t (t = len(trace): the trace's own grade, n = 0), jump = p(t+1)
    - p(t) where t + 1 was visited too, pivotal = |jump| ≥ threshold, score (the token's disagreement).
    """
    _check(trace, samples)
    check_score(score)
    if not 0 < threshold <= 1:
        raise InvalidInputError(f"threshold must be in (0, 1], got {threshold!r}")
    temp = resolve_temperature(trace, temperature)
    n = samples if temp > 0 else 1
    end = len(trace)
    found: dict[int, tuple[int, int]] = {}  # t -> (correct, n)

    def p(t: int) -> float:
        if t not in found:
            if t == end:
                found[t] = (int(bool(grade_trace(trace))), 0)
            else:
                kids = _continue(pair, trace, t, ["base"] * n, sample_seeds(seed, t, n), then="base", temperature=temp,
                                 store=store, max_new_tokens=max_new_tokens, should_stop=should_stop)
                found[t] = (_correct(kids), n)
            if progress is not None:
                progress(len(found), len(found) + len(stack))
        return _prob(*found[t])

    stack = [(0, end)]
    while stack:
        a, b = stack.pop()
        if b - a > 1 and abs(p(b) - p(a)) >= threshold:
            mid = (a + b) // 2
            p(mid)  # visited even when both halves are single tokens: their jumps are read off it
            stack += [(mid, b), (a, mid)]
    values = np.asarray(score_values(trace.metrics, score), dtype=np.float64)
    rows = []
    for t in sorted(found):
        c, m = found[t]
        prob = _prob(c, m)
        low, high = wilson(c, m) if m else (prob, prob)
        jump = _prob(*found[t + 1]) - prob if t + 1 in found else float("nan")
        rows.append({"trace": trace.key, "pos": t, "token": trace.tokens[t] if t < end else "",
                     "p": prob, "ci_low": low, "ci_high": high, "n": m, "jump": jump,
                     "pivotal": bool(np.isfinite(jump) and abs(jump) >= threshold),
                     "score": float(values[t]) if t < end else float("nan"), "interval": INTERVAL})
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def _prob(correct: int, n: int) -> float:
    """The estimated P(correct); n = 0 marks a known outcome (the trace's own grade)."""
    return correct / n if n else float(correct)


def pivot_correlation(curve: pd.DataFrame) -> float:
    """Spearman's rank correlation of pivotal-token size |jump| and the token's disagreement score, over
    the tokens whose jump was measured."""
    return spearman(curve["jump"].abs(), curve["score"])
