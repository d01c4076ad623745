"""Dataset: the paper's analyses (`core.analysis`) as interactive figures over a chosen set of traces."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import resources, state
from app.context import get_context
from app.compare_panels import rank_shift_tab, reasoner_tables, reasoners_tab
from app.view import select_rows, with_policy_labels
from core.analysis import tables as A
from core import rank_shift as rs
from core import settings
from core.analysis import report as R
from core.errors import ForkpointError
from core.metrics import score_label
from core.evaluation.harness import stored_policy_table

MAX_TRACES = 2000


@st.cache_data(show_spinner=False, max_entries=32)
def _analysis(name: str, path: str, keys: tuple[str, ...], score: str, top: float, segment: str | None,
              extra: str = "") -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Run one analysis over the stored traces `keys` (cached by keys and settings)."""
    traces = [resources.load_trace(path, k) for k in keys]
    if name == "lorenz":
        return A.lorenz(traces, score=score, segment=segment), A.gini_table(traces, score=score, segment=segment)
    if name == "position":
        return A.position_density(traces, score=score, top=top, segment=segment), None
    if name == "iou":
        return A.entropy_iou(traces, score=score, segment=segment), None
    if name == "enrichment":
        return A.enrichment(traces, score=score, top=top, segment=segment), None
    if name == "auroc":
        return A.roc_curve(traces, score=score, segment=segment), A.failure_auroc(traces, score=score, segment=segment)
    if name == "rank":
        return A.reason_rank(traces, at=extra or "all", score=score, segment=segment), None
    if name == "recovery":
        return stored_policy_table(traces), None
    if name == "rank_shift":
        return rs.at_positions(traces, score=score, top=top), rs.trace_table(traces)
    raise ValueError(name)


@st.cache_data(show_spinner=False, max_entries=8)
def _reasoners(path: str, keys: tuple[str, ...], score: str, top: float):
    """The Reasoners tab's tables (cached by keys and settings: enrichment tags every trace)."""
    return reasoner_tables([resources.load_trace(path, k) for k in keys], score, top)


def _select(ctx) -> tuple[str, ...]:
    df = ctx.store.summaries()
    if df.empty:
        return ()
    df = with_policy_labels(df)
    c1, c2, c3 = st.columns(3)
    pairs = sorted(df["pair"].dropna().unique())
    pick_pairs = c1.multiselect("Pair", pairs, default=pairs, key="ds_pair")
    policies = sorted(df["policy"].dropna().unique())
    pick_pol = c2.multiselect("Policy", policies, default=policies, key="ds_policy")
    kinds = sorted(df["kind"].dropna().unique())
    pick_kind = c3.multiselect("Kind", kinds, default=[k for k in kinds if k != "branch"] or kinds, key="ds_kind")
    rows = select_rows(df, pick_pairs, pick_pol, pick_kind)
    if len(rows) > MAX_TRACES:
        st.caption(f"Using the newest {MAX_TRACES} of {len(rows)} traces.")
        rows = rows.tail(MAX_TRACES)
    return tuple(rows["key"].astype(str))


def _show(fig_fn, name: str, path: str, keys, score, top, segment, extra: str = "", table_label: str = "table") -> None:
    try:
        df, second = _analysis(name, path, keys, score, top, segment, extra)
        fig = fig_fn(df, second) if name == "auroc" else fig_fn(df)
    except ForkpointError as err:
        st.warning(str(err))
        return
    _tidy(name, fig)
    st.plotly_chart(fig, width="stretch", key=f"ds_fig_{name}")
    if name == "enrichment":
        st.caption("“all planning” pools every planning category (plan, reflect, verify, conclude): the paper's "
                   "single planning share; the other bars are the categories themselves.")
    with st.expander(table_label):
        st.dataframe(second if second is not None else df, hide_index=True, width="stretch")


def _tidy(name: str, fig) -> None:
    """Display fixes: one legend entry for the faint per-trace Lorenz curves, a named pooled planning
    category, readable log-axis ticks."""
    if name == "lorenz":
        first = True
        for tr in fig.data:
            if tr.name not in ("equality", A.POOLED):
                tr.update(legendgroup="traces", name="per trace (a few)", showlegend=first, hovertemplate=None)
                first = False
    elif name == "enrichment":
        for tr in fig.data:
            tr.x = ["all planning" if str(x) == "planning" else x for x in tr.x]
    elif name == "iou":
        fig.update_xaxes(tickvals=[0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0],
                         ticktext=["0.1%", "0.2%", "0.5%", "1%", "2%", "5%", "10%", "20%", "50%", "100%"],
                         minor={"showgrid": False})


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
    tabs = st.tabs(["Lorenz", "Position", "Entropy IoU", "Planning enrichment", "Failure AUROC", "Reasoner rank",
                    "Recovery vs budget", "Rank shift", "Reasoners"])
    path = s.store_path
    with tabs[0]:
        _show(R.lorenz_figure, "lorenz", path, keys, s.score, top, segment, table_label="Gini per trace")
    with tabs[1]:
        _show(R.position_density_figure, "position", path, keys, s.score, top, segment)
    with tabs[2]:
        _show(R.entropy_iou_figure, "iou", path, keys, s.score, top, segment)
    with tabs[3]:
        _show(R.enrichment_figure, "enrichment", path, keys, s.score, top, segment)
    with tabs[4]:
        _show(R.roc_figure, "auroc", path, keys, s.score, top, segment, table_label="AUROC")
    with tabs[5]:
        at = st.radio("At", A.RANK_AT, horizontal=True, key="ds_rank_at")
        _show(R.reason_rank_figure, "rank", path, keys, s.score, top, segment, extra=at)
    with tabs[6]:
        _show(R.recovery_figure, "recovery", path, keys, s.score, top, segment)
    with tabs[7]:
        table, per_trace = _analysis("rank_shift", path, keys, s.score, top, None)
        rank_shift_tab(table, per_trace, s.score, top)  # app/compare_panels.py
    with tabs[8]:
        reasoners_tab(*_reasoners(path, keys, s.score, top))


main()
