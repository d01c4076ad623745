"""Plain helpers behind the pages: reshape core's records for display. No streamlit, no model maths.

Everything numeric comes from `core` (metrics, spikes, tags, grading); these functions only select,
slice, round and label.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from core import settings
from core.spike_rules import Gate, top_count
from core.metrics import DEFAULT_SCORE, SCORES, score_values
from core.errors import InvalidInputError
from core.io.exports import annotated
from core.evaluation.problems import Problem
from core.trace import Trace

PROB_MODES = ("prob", "logprob")  # how probabilities are shown
RANGES = ("trace", "pair")  # colour range: each trace's own min..max, or one range over the pair's stored traces
RANGE_LABELS = {"trace": "per trace (own min..max)", "pair": "fixed across this pair's traces"}
CORRECT_FILTERS = ("any", "yes", "no", "ungraded")  # the trace tables' "Correct" filter
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~:$&\"'=/@])")


def md_escape(value: object, limit: int = 200) -> str:
    """Any text (e.g. a URL parameter) as Markdown that shows literally: every ASCII punctuation mark is
    backslash-escaped, so no link, image, autolink, emphasis or `:colour[...]` directive can form."""
    text = re.sub(r"\s*[\r\n\t\f\v]\s*", " ", str(value))  # one line; other spacing (indents) kept
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return _MD_SPECIAL.sub(r"\\\1", text)


def md_code(value: object, limit: int = 80) -> str:
    """Any text as a Markdown inline-code span (shown literally: no links, images or emphasis)."""
    text = " ".join(str(value).split()).replace("`", "ʼ")
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return f"`{text}`" if text else "`(empty)`"


# -- spike rules ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpikeRule:
    """How spikes are chosen: the top fraction `top` of a trace's scores, or a calibrated `gate`."""

    top: float | None = settings.SPIKE_TOP
    gate: Gate | None = None

    def key(self) -> str:
        """A stable string for caching."""
        return json.dumps({"top": self.top, "gate": self.gate.to_dict() if self.gate else None}, sort_keys=True)

    def describe(self) -> str:
        if self.gate is not None:
            g = self.gate
            return f"gate τ={g.tau:.3g}, λ={g.lam:.3g}, W={g.window}"
        return f"top {100 * (self.top or 0):g}%"


def annotate_view(trace: Trace, score: str = DEFAULT_SCORE, rule: SpikeRule | None = None) -> Trace:
    """The trace with the layers the Trace page shows: spikes under `rule`, planning tags, segments (the
    annotations every export carries, `core.io.exports.annotated`, under the sidebar's rule)."""
    rule = rule or SpikeRule()
    return annotated(trace, score, top=None if rule.gate else (rule.top or settings.SPIKE_TOP), gate=rule.gate)


def spike_count(n_tokens: int, rule: SpikeRule) -> int | None:
    """Spikes a trace of `n_tokens` gets under a top-p rule (None for a gate: it depends on the scores)."""
    if rule.gate is not None:
        return None
    return top_count(rule.top or settings.SPIKE_TOP, int(n_tokens))


# -- branches -------------------------------------------------------------------------------------


def first_difference(a: Trace, b: Trace, start: int = 0) -> int | None:
    """First position ≥ start where the two token sequences differ (a length difference counts), or None."""
    n = min(len(a), len(b))
    if start < n:
        diff = np.flatnonzero(a.token_ids[start:n] != b.token_ids[start:n])
        if diff.size:
            return int(start + diff[0])
    longest = max(len(a), len(b))
    return max(n, start) if len(a) != len(b) and max(n, start) < longest else None


def tail(trace: Trace, start: int, end: int | None = None) -> Trace:
    """Tokens start..end-1 (default: to the end) as a new trace (metrics, top-k, sources and token layers cut
    alike; spike positions shifted to the slice)."""
    n = len(trace)
    start = max(0, min(int(start), n))
    end = n if end is None else max(start, min(int(end), n))
    cut = {}
    for name, layer in trace.annotations.items():
        if isinstance(layer, (list, tuple)) and len(layer) == n:
            cut[name] = list(layer[start:end])
    spikes_layer = trace.annotations.get("spikes")
    if isinstance(spikes_layer, dict):
        cut["spikes"] = {**spikes_layer,
                         "positions": [p - start for p in spikes_layer.get("positions", []) if start <= p < end]}
    return Trace(
        token_ids=trace.token_ids[start:end], tokens=trace.tokens[start:end], prompt_ids=trace.prompt_ids,
        metrics={name: np.asarray(v)[start:end] for name, v in trace.metrics.items()},
        topk={side: (ids[start:end], probs[start:end]) for side, (ids, probs) in trace.topk.items()},
        source=trace.source[start:end], meta=trace.meta, annotations=cut,
    )


PAGE_TOKENS = 4096  # the token view shows at most this many tokens at once (a 16k-token trace: 4 pages)


def page_bounds(n_tokens: int, page: int, size: int = PAGE_TOKENS) -> tuple[int, int]:
    """[start, end) of page `page` (clamped) of a trace of `n_tokens`."""
    pages = max(1, -(-int(n_tokens) // size))
    page = max(0, min(int(page), pages - 1))
    return page * size, min(int(n_tokens), (page + 1) * size)


DIFF_COLUMNS = ["op", "pos_original", "pos_branch", "original", "branch", "score_original", "score_branch", "delta"]


def token_diff(original: Trace, branch: Trace, start: int, score: str = DEFAULT_SCORE) -> pd.DataFrame:
    """Original vs branch from `start` on, aligned token by token (difflib over token ids): one row per
    aligned pair (op equal / replace) or unpaired token (insert / delete), with both scores and
    delta = branch - original (NaN where a side is missing)."""
    import difflib

    a = original.token_ids[start:].tolist()
    b = branch.token_ids[start:].tolist()
    sa = np.asarray(score_values(original.metrics, score), dtype=np.float64)
    sb = np.asarray(score_values(branch.metrics, score), dtype=np.float64)
    rows: list[dict[str, Any]] = []

    def row(op: str, i: int | None, j: int | None) -> None:
        va = float(sa[start + i]) if i is not None else math.nan
        vb = float(sb[start + j]) if j is not None else math.nan
        rows.append({"op": op, "pos_original": None if i is None else start + i,
                     "pos_branch": None if j is None else start + j,
                     "original": "" if i is None else original.tokens[start + i],
                     "branch": "" if j is None else branch.tokens[start + j],
                     "score_original": va, "score_branch": vb, "delta": vb - va})

    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal" or op == "replace":
            pairs = list(zip(range(i1, i2), range(j1, j2)))
            for i, j in pairs:
                row(op, i, j)
            for i in range(i1 + len(pairs), i2):
                row("delete", i, None)
            for j in range(j1 + len(pairs), j2):
                row("insert", None, j)
        elif op == "delete":
            for i in range(i1, i2):
                row(op, i, None)
        else:
            for j in range(j1, j2):
                row(op, None, j)
    df = pd.DataFrame(rows, columns=DIFF_COLUMNS)
    for col in ("pos_original", "pos_branch"):
        df[col] = df[col].astype("Int64")
    return df


# -- problems and the Problems table --------------------------------------------------------------


def as_problems(rows: Iterable[Any]) -> list[Problem]:
    """Problems from core.problems records or plain dicts (demo rows: id, question, answer)."""
    out = []
    for i, row in enumerate(rows):
        if isinstance(row, Problem):
            out.append(row)
            continue
        prompt = row.get("prompt") or row.get("question") or row.get("problem")
        gold = row.get("gold", row.get("answer"))
        out.append(Problem(str(row.get("id", f"problem-{i}")), str(prompt), None if gold is None else str(gold)))
    return out


TABLE_COLUMNS = ["problem", "prompt", "pair", "policy", "kind", "n_tokens", "max", "top100_mean", "max spikes",
                 "takeovers", "rho", "correct", "branch_pos", "created", "key"]  # fmt: skip


def trace_table(summaries: pd.DataFrame, score: str = DEFAULT_SCORE, rule: SpikeRule | None = None) -> pd.DataFrame:
    """The Problems page table: one row per stored trace with the chosen score's max and top-100 mean."""
    if score not in SCORES:
        raise InvalidInputError(f"Unknown score {score!r}; choose one of: {', '.join(SCORES)}")
    rule = rule or SpikeRule()
    if summaries.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    df = pd.DataFrame({
        "problem": summaries["problem"].astype("string"),
        "prompt": summaries["prompt"].astype("string"),
        "pair": summaries["pair"],
        "policy": summaries["policy"],
        "kind": summaries["kind"],
        "n_tokens": summaries["n_tokens"].astype("Int64"),
        "max": pd.to_numeric(summaries[f"max_{score}"], errors="coerce"),
        "top100_mean": pd.to_numeric(summaries[f"top100_{score}"], errors="coerce"),
        # what the sidebar's top-p rule allows (fewer are marked where scores are ~0); a gate's count
        # depends on every score, which the summaries do not hold: blank
        "max spikes": [spike_count(n, rule) for n in summaries["n_tokens"]],
        "takeovers": summaries["n_takeovers"].astype("Int64"),
        "rho": pd.to_numeric(summaries["rho"], errors="coerce"),
        "correct": summaries["correct"].astype("boolean"),
        "branch_pos": summaries["branch_pos"].astype("Int64"),
        "created": summaries["created"],
        "key": summaries["key"],
    })
    df["max spikes"] = df["max spikes"].astype("Int64")
    return df.reset_index(drop=True)


def filter_table(df: pd.DataFrame, text: str = "", policies: Sequence[str] = (), kinds: Sequence[str] = (),
                 correct: str = "any") -> pd.DataFrame:
    """Rows whose problem/prompt contains `text` (case-insensitive), of the given policies and kinds,
    with `correct` in any / yes / no / ungraded."""
    keep = pd.Series(True, index=df.index)
    if text:
        needle = text.lower()
        hay = df["problem"].fillna("").str.lower() + " " + df["prompt"].fillna("").str.lower()
        keep &= hay.str.contains(needle, regex=False)
    if policies:
        keep &= df["policy"].isin(list(policies))
    if kinds:
        keep &= df["kind"].isin(list(kinds))
    if correct == "yes":
        keep &= df["correct"].fillna(False).astype(bool)
    elif correct == "no":
        keep &= (~df["correct"].fillna(True).astype(bool))
    elif correct == "ungraded":
        keep &= df["correct"].isna()
    elif correct != "any":
        raise InvalidInputError(f"Unknown correct filter {correct!r}; choose one of: {', '.join(CORRECT_FILTERS)}")
    return df[keep].reset_index(drop=True)


# -- the Dataset page's trace selection ----------------------------------------------------------


def with_policy_labels(summaries: pd.DataFrame) -> pd.DataFrame:
    """Summaries whose missing policy (scored and imported traces) reads "(score)" / "(import)", so a
    Policy filter lists them and keeps them (they were dropped when the policy was None)."""
    labels = summaries["policy"].where(summaries["policy"].notna(), "(" + summaries["kind"].astype(str) + ")")
    return summaries.assign(policy=labels)


def select_rows(df: pd.DataFrame, pairs: Sequence[str], policies: Sequence[str], kinds: Sequence[str]) -> pd.DataFrame:
    """Non-empty traces of the chosen pairs, policies (as `with_policy_labels` names them) and kinds."""
    keep = df["pair"].isin(list(pairs)) & df["policy"].isin(list(policies)) & df["kind"].isin(list(kinds))
    return df[keep & (df["n_tokens"] > 0)]
