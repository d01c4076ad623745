"""Dataset: the paper's analyses (`core.analysis`) as interactive figures over a chosen set of traces."""

from __future__ import annotations

import streamlit as st

from app import resources, state
from app.compare_panels import rank_shift_tab, reasoner_tables, reasoners_tab
from app.context import get_context
from app.dataset_panels import FILTERS, MAX_TRACES, analysis_figure, analysis_tables, filter_choices, selected_keys
from app.instruments_panels import dataset_instruments
from app.view import with_policy_labels
from core import settings
from core.analysis.registry import Analysis, list_analyses
from core.errors import ForkpointError
from core.reports import gates_report
from core.reports.gates import read_gates
from core.scoring.registry import score_label


@st.cache_data(show_spinner=False, max_entries=8)
def _reasoners(path: str, keys: tuple[str, ...], score: str, top: float):
    """The Reasoners tab's tables (cached by keys and settings: enrichment tags every trace)."""
    return reasoner_tables(resources.stored_traces(path, keys), score, top)


def _select(ctx) -> tuple[str, ...]:
    df = ctx.store.summaries()
    if df.empty:
        return ()
    df = with_policy_labels(df)
    picks = [column.multiselect(FILTERS[name], options, default=default, key=f"ds_{name}")
             for column, (name, (options, default)) in zip(st.columns(len(FILTERS)), filter_choices(df).items())]
    keys, total = selected_keys(df, picks)
    if total > MAX_TRACES:
        st.caption(f"Using the newest {MAX_TRACES} of {total} traces.")
    return keys


def _show(spec: Analysis, path: str, keys, score, top, segment) -> None:
    """One analysis tab: its figure (with its option picker) and its detail table."""
    if spec.help:
        st.caption(spec.help)
    choice = {k: st.radio(k, values, horizontal=True, key=f"ds_{spec.name}_{k}") for k, values in spec.options.items()}
    try:
        tables = analysis_tables(spec.name, path, keys, score, top, segment)
    except ForkpointError as err:
        st.warning(str(err))
        return
    if spec.name == "rank_shift":
        rank_shift_tab(tables["rank_shift"], tables["rank_shift_per_trace"], score, top)  # app/compare_panels.py
        return
    for note in dict.fromkeys(n for t in tables.values() if "note" in t.columns
                              for n in t["note"].dropna().astype(str) if n):  # e.g. why an AUROC is undefined
        st.info(note)
    if spec.figure:
        st.plotly_chart(analysis_figure(spec, tables, choice), width="stretch", key=f"ds_fig_{spec.name}")
    if spec.name == "enrichment":
        st.caption("“all planning” pools every planning category (plan, reflect, verify, conclude): the paper's "
                   "single planning share; the other bars are the categories themselves.")
    if spec.detail:
        with st.expander(spec.detail.replace("_", " "), expanded=spec.figure is None):
            st.dataframe(tables[spec.detail], hide_index=True, width="stretch")


def _gates_tab() -> None:
    """The gate shoot-out (`forkpoint gates --out DIR`): its table and Pareto plots, read from DIR/gates.csv."""
    where = st.text_input("Shoot-out folder or gates.csv", key="ds_gates_path",
                          help="Written by `forkpoint gates --out DIR` (or core.compare_gates + write_gates).")
    if not where:
        st.caption("Run `forkpoint gates --gate-rhos 0.02,0.05,0.1 --out DIR` and give DIR here.")
        return
    try:
        table = read_gates(where)
    except ForkpointError as err:
        st.error(str(err))
        return
    st.caption(gates_report.NOTE)
    st.dataframe(table[[c for c in gates_report.SHOWN if c in table.columns]], hide_index=True)
    for heading, fig in gates_report.gates_figures(table):
        st.plotly_chart(fig, width="stretch", key=f"ds_gates_{heading}")


def main() -> None:
    ctx = get_context()
    state.show_notice()
    st.title("Dataset")
    keys = _select(ctx)
    if not keys:
        st.info("No traces selected (the store may be empty: use Generate).")
        return
    s = ctx.settings
    top = s.rule.top or settings.SPIKE_TOP
    c1, c2 = st.columns(2)
    segment = c1.selectbox("Segment", (None, "think", "answer"), key="ds_segment",
                           format_func=lambda x: "whole response" if x is None else x)
    source = ("sidebar" if s.rule.gate is None else
              "the sidebar's calibrated gate does not apply to these pooled analyses; its p% does")
    c2.caption(f"{len(keys)} traces · score {score_label(s.score)} · top fraction {top:g} ({source})")
    specs = list_analyses()
    # lazy tabs: only the open one runs (each analysis reads every selected trace; Reasoners tags them all)
    tabs = st.tabs([spec.label for spec in specs] + ["Reasoners", "Gates"], key=state.DATASET_TAB_KEY,
                   on_change="rerun")
    path = s.store_path
    for tab, spec in zip(tabs, specs):
        if tab.open:
            with tab:
                _show(spec, path, keys, s.score, top, segment)
    if tabs[-2].open:
        with tabs[-2]:
            reasoners_tab(*_reasoners(path, keys, s.score, top))
    if tabs[-1].open:
        with tabs[-1]:
            _gates_tab()
    dataset_instruments(ctx, keys)

main()
