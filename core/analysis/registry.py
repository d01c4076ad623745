"""The analysis registry: every dataset-level analysis once, read by the report, the CLI and the Dataset page.

An `Analysis` turns traces into named tables (`run`) and names the figure of `core/reports/report.py`
that draws them. `forkpoint analyze`, `report_tables`/`report_html` and the app's Dataset tabs iterate
`ANALYSES`, so a new analysis is one entry here (and, for a plot, one figure function).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from core import settings
from core.analysis import tables as A
from core.annotate import rank_shift
from core.errors import InvalidInputError
from core.evaluation.harness import stored_policy_table
from core.scoring.registry import DEFAULT_SCORE
from core.trace import Trace
from core.views.exports import token_decoder

Tables = dict[str, pd.DataFrame]


def _decision_pairs(traces: Sequence[Trace], score: str, top: float, segment: str | None) -> pd.DataFrame:
    """`decision_pairs` with every choice's text, from the tokenizer the traces record when it loads offline
    (without one, only a choice equal to the emitted token has a text: the disagreements would have none)."""
    decode = token_decoder(traces)
    return A.decision_pairs(traces, None if decode is None else lambda ids: decode(ids[0]), score=score, top=top,
                            segment=segment)


@dataclass(frozen=True)
class Analysis:
    """One analysis: `run(traces, score, top, segment)` gives named tables; `figure` (a function name in
    core/reports/report.py) draws `figure_tables` of them; `detail` is the table shown under the figure."""

    name: str
    label: str
    help: str
    run: Callable[[list[Trace], str, float, str | None], Tables]
    figure: str | None = None
    figure_tables: tuple[str, ...] = ()
    detail: str | None = None
    options: dict[str, tuple[str, ...]] = field(default_factory=dict)  # a choice that picks the figure's table


def _reason_rank(traces: list[Trace], score: str, top: float, segment: str | None) -> Tables:
    out = {f"reason_rank_{at}": A.reason_rank(traces, at, score, segment=segment) for at in A.RANK_AT}
    out["reason_rank_within"] = A.reason_rank_within(traces, score, segment=segment)
    return out


ANALYSES: dict[str, Analysis] = {a.name: a for a in [
    Analysis("lorenz", "Lorenz", "How concentrated the disagreement is: Lorenz curves, Gini and the token share "
             "holding 80% of the score mass.",
             lambda t, s, p, g: {"lorenz": A.lorenz(t, s, segment=g), "gini": A.gini_table(t, s, segment=g),
                                 "mass_fraction": A.mass_fraction(t, s, segment=g)},
             "lorenz_figure", ("lorenz",), "gini"),
    Analysis("position", "Position", "Where the top-p% tokens sit along the response (u = t/T).",
             lambda t, s, p, g: {"position_density": A.position_density(t, s, top=p, segment=g)},
             "position_density_figure", ("position_density",), "position_density"),
    Analysis("entropy_iou", "Entropy IoU", "Overlap of the top disagreement tokens with the top base-entropy tokens.",
             lambda t, s, p, g: {"entropy_iou": A.entropy_iou(t, s, segment=g)},
             "entropy_iou_figure", ("entropy_iou",), "entropy_iou"),
    Analysis("enrichment", "Planning enrichment", "Planning-tag categories among the top tokens against all tokens.",
             lambda t, s, p, g: {"enrichment": A.enrichment(t, s, top=p, segment=g)},
             "enrichment_figure", ("enrichment",), "enrichment"),
    Analysis("failure_auroc", "Failure AUROC", "Predicting a wrong answer from the response's scores.",
             lambda t, s, p, g: {"roc": A.roc_curve(t, score=s, segment=g),
                                 "failure_auroc": A.failure_auroc(t, score=s, segment=g)},
             "roc_figure", ("roc", "failure_auroc"), "failure_auroc"),
    Analysis("reason_rank", "Reasoner rank", "Where the reasoner's top token ranks under the base model.",
             _reason_rank, "reason_rank_figure", ("reason_rank_{at}",), "reason_rank_within", {"at": A.RANK_AT}),
    Analysis("recovery", "Recovery vs budget", "Accuracy and recovery per stored policy against its takeover rate.",
             lambda t, s, p, g: {"recovery": stored_policy_table(t)}, "recovery_figure", ("recovery",), "recovery"),
    Analysis("rank_shift", "Rank shift", "Unshifted / marginal / shifted reasoner choices at spikes and takeovers.",
             lambda t, s, p, g: {"rank_shift": rank_shift.at_positions(t, score=s, top=p),
                                 "rank_shift_per_trace": rank_shift.per_trace_table(t)}, None, (), "rank_shift"),
    Analysis("decision_pairs", "Decision pairs", "The base's and the reasoner's choice at the top positions.",
             lambda t, s, p, g: {"decision_pairs": _decision_pairs(t, s, p, g)}, None, (), "decision_pairs"),
]}  # fmt: skip


def list_analyses() -> list[Analysis]:
    """Every registered analysis, in the order the report and the Dataset page show them."""
    return list(ANALYSES.values())


def analysis(name: str) -> Analysis:
    """The analysis `name`, or InvalidInputError listing the choices."""
    if name not in ANALYSES:
        raise InvalidInputError(f"Unknown analysis {name!r}; choose one of: {', '.join(ANALYSES)}")
    return ANALYSES[name]


def run_analysis(name: str, traces: Sequence[Trace], score: str = DEFAULT_SCORE, top: float = settings.SPIKE_TOP,
                 segment: str | None = None) -> Tables:
    """The named tables of one analysis over `traces` (a lazy sequence such as `StoredTraces` stays lazy)."""
    return analysis(name).run(traces if isinstance(traces, Sequence) else list(traces), score, top, segment)


def figure_table_names(spec: Analysis, **choices: Any) -> list[str]:
    """The tables `spec.figure` draws, with option choices filled in (e.g. at="spikes")."""
    picked = {k: choices.get(k, values[0]) for k, values in spec.options.items()}
    return [name.format(**picked) for name in spec.figure_tables]
