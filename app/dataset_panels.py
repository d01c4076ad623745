"""What the Dataset page shows before any widget is touched, in one place: the traces a fresh page selects, an
analysis's tables (cached) and its figure. The page (app/screens/dataset.py) draws them; a Dataset link's first
paint (app/first_paint.py) draws the first tab's figure from the same calls while Streamlit is still loading."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import resources
from app.view import select_rows
from core.analysis.registry import Analysis, figure_table_names, run_analysis
from core.reports import report as R

MAX_TRACES = 2000  # the newest this many selected traces are analysed
FILTERS = {"pair": "Pair", "policy": "Policy", "kind": "Kind"}  # summary column -> the page's filter, in its order


def filter_choices(summaries: pd.DataFrame) -> dict[str, tuple[list[str], list[str]]]:
    """Per filter, its options and what a fresh page selects: every pair and policy, every kind but branches (all
    kinds when there are only branches). `summaries` as `app.view.with_policy_labels` names the policies."""
    out = {}
    for name in FILTERS:
        options = sorted(summaries[name].dropna().unique())
        default = ([k for k in options if k != "branch"] or options) if name == "kind" else options
        out[name] = (options, default)
    return out


def selected_keys(summaries: pd.DataFrame, picks: Sequence[Sequence[str]]) -> tuple[tuple[str, ...], int]:
    """(the keys of the newest MAX_TRACES traces the picks select, how many they select), picks in FILTERS order."""
    rows = select_rows(summaries, *picks)
    return tuple(rows.tail(MAX_TRACES)["key"].astype(str)), len(rows)


@st.cache_data(show_spinner=False, max_entries=32)
def analysis_tables(name: str, path: str, keys: tuple[str, ...], score: str, top: float,
                    segment: str | None) -> dict[str, pd.DataFrame]:
    """The tables of one registered analysis over the stored traces `keys` (cached by keys and settings)."""
    return run_analysis(name, resources.stored_traces(path, keys), score, top, segment)


def analysis_figure(spec: Analysis, tables: Mapping[str, pd.DataFrame], choice: Mapping[str, str]) -> go.Figure:
    """The figure of analysis `spec` (which has one) for its option `choice`, with the page's display fixes."""
    fig = getattr(R, spec.figure)(*[tables[n] for n in figure_table_names(spec, **choice)])
    _tidy(spec.name, fig)
    return fig


def _tidy(name: str, fig: go.Figure) -> None:
    """Display fixes: a named pooled planning category, readable log-axis ticks."""
    if name == "enrichment":
        for tr in fig.data:
            tr.x = ["all planning" if str(x) == "planning" else x for x in tr.x]
    elif name == "entropy_iou":
        fig.update_xaxes(tickvals=[0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0],
                         ticktext=["0.1%", "0.2%", "0.5%", "1%", "2%", "5%", "10%", "20%", "50%", "100%"],
                         minor={"showgrid": False})
