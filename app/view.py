"""Plain helpers behind the pages: reshape core's records for display. No streamlit, no model maths.

Everything numeric comes from `core` (metrics, spikes, tags, grading); these functions only select,
slice, round and label.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from core import settings
from core.annotate.spikes import Gate, top_count
from core.errors import InvalidInputError
from core.evaluation.problems import Problem
from core.record.problems import problem_record
from core.scoring.registry import DEFAULT_SCORE, SCORES
from core.trace import Trace
from core.annotate.shown import annotated
from core.views.presentation import policy_text

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
    raw = str(value)
    text = " ".join(raw.split()).replace("`", "ʼ")
    if not text and raw:  # a space or newline token: show it, never "(empty)"
        text = repr(raw)
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
    annotations every export carries, `core.annotate.shown.annotated`, under the sidebar's rule)."""
    rule = rule or SpikeRule()
    return annotated(trace, score, top=None if rule.gate else (rule.top or settings.SPIKE_TOP), gate=rule.gate)


def spike_count(n_tokens: int, rule: SpikeRule) -> int | None:
    """Spikes a trace of `n_tokens` gets under a top-p rule (None for a gate: it depends on the scores)."""
    if rule.gate is not None:
        return None
    return top_count(rule.top or settings.SPIKE_TOP, int(n_tokens))




# -- problems and the Problems table --------------------------------------------------------------


def as_problems(rows: Iterable[Any]) -> list[Problem]:
    """Problems from core.problems records or plain dicts (demo rows: id, question, answer), read by core's
    one problem reader (`core.record.problems.problem_record`)."""
    out = []
    for i, row in enumerate(rows):
        if isinstance(row, Problem):
            out.append(row)
            continue
        rec = problem_record(row)
        gold = rec["gold"]
        out.append(Problem(str(rec["id"] if rec["id"] is not None else f"problem-{i}"), rec["prompt"],
                           None if gold is None else str(gold)))
    return out


TABLE_COLUMNS = ["problem", "prompt", "pair", "policy", "kind", "n_tokens", "max", "top100_mean", "max spikes",
                 "takeovers", "rho", "correct", "branch_pos", "created", "key"]  # fmt: skip


def _policy_names(summaries: pd.DataFrame) -> pd.Series:
    """The policy column as the Trace page names it: the policy, else the trace's kind (an import has none)."""
    parents = summaries["parent"] if "parent" in summaries else [None] * len(summaries)
    return pd.Series([policy_text(p, k, par) for p, k, par in zip(summaries["policy"], summaries["kind"], parents)],
                     index=summaries.index, dtype="object")


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
        "policy": _policy_names(summaries),
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
