"""Problems: every stored trace (pair, policy, length, scores, spikes, takeovers, correctness) and every
problem of the set; sort and filter, choose a row to open its trace."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from app import actions, resources, state
from app.context import get_context
from app.filters import subset_filter, trace_filter
from app.notes_panel import notes_search_tab
from app.search_panel import apply_search_filter, search_tab
from app.view import md_escape, trace_table
from core.errors import ForkpointError
from core.scoring.registry import score_label

TRACE_PAGE = Path(__file__).resolve().parent / "trace.py"
# the outcome and the numbers first: on a laptop screen "correct", "ρ" and "key" were off to the right
TRACE_COLUMNS = ["problem", "correct", "takeovers", "rho", "max", "max spikes", "policy", "n_tokens", "key", "prompt",
                 "top100_mean", "kind", "branch_pos", "pair", "created"]


def _open_selected_trace(table: pd.DataFrame) -> None:
    event = st.session_state.get("problems_traces")
    rows = (event or {}).get("selection", {}).get("rows", []) if event else []
    if rows and rows[0] < len(table):
        row = table.iloc[rows[0]]
        state.open_trace(str(row["key"]), None if pd.isna(row["problem"]) else str(row["problem"]))
        st.session_state["_goto_trace"] = True


def _open_selected_problem(table: pd.DataFrame) -> None:
    event = st.session_state.get("problems_set")
    rows = (event or {}).get("selection", {}).get("rows", []) if event else []
    if rows and rows[0] < len(table):
        st.session_state["_goto_problem"] = str(table.iloc[rows[0]]["id"])


def traces_tab(ctx, bad: list) -> None:
    """The stored traces that read in full (`bad`: the damaged files, left out and counted apart)."""
    s = ctx.settings
    table = trace_table(ctx.store.summaries(), s.score, s.rule)
    damaged = {p.name.removesuffix(".parquet") for p, _ in bad}
    table = table[~table["key"].isin(damaged)].reset_index(drop=True)  # a footer can read while a page cannot
    if table.empty:
        if bad:
            st.warning(f"No readable traces: all {len(bad)} trace file(s) are damaged (listed below).")
        else:
            st.info("The store holds no traces yet: open the Trace page (it makes one) or use Generate.")
        return
    shown = subset_filter(apply_search_filter(trace_filter(table, "pf"))).reset_index(drop=True)
    more = f" (+{len(bad)} damaged, listed below)" if bad else ""
    st.caption(f"{len(shown)} of {len(table)} readable traces{more} · score: {score_label(s.score)} · "
               "click a column header to sort; choose a row to open it.")
    if shown.empty:
        st.info("No trace matches the filters and the search above: clear them to see every trace.")
    st.dataframe(
        shown, key="problems_traces", on_select=lambda: _open_selected_trace(shown), selection_mode="single-row",
        hide_index=True, width="stretch", column_order=TRACE_COLUMNS,
        column_config={
            "prompt": st.column_config.TextColumn("prompt", width="large"),
            "max": st.column_config.NumberColumn("max score", format="%.3f"),
            "top100_mean": st.column_config.NumberColumn("top-100 mean", format="%.3f"),
            "max spikes": st.column_config.NumberColumn(
                "max spikes", help="ceil(p·n) under the sidebar's top-p rule; fewer are marked where the score is "
                                   "~0. Blank under a calibrated gate (open the trace to see its spikes)."),
            "rho": st.column_config.NumberColumn("ρ", format="%.3f"),
            "correct": st.column_config.CheckboxColumn("correct"),
            "key": st.column_config.TextColumn("key", width="small"),
        },
    )


def problems_tab(ctx) -> None:
    s = ctx.settings
    try:
        problems = resources.problem_set(s.problems_path)
    except ForkpointError as err:
        st.error(f"Could not read the problems: {md_escape(err, 400)}")
        return
    df = ctx.store.summaries()
    if df.empty:
        counts = pd.DataFrame(columns=["traces", "correct"])
    else:
        graded = df.assign(correct=df["correct"].map({True: 1.0, False: 0.0}).astype("float64"))
        counts = graded.groupby(graded["problem"].astype("string")).agg(traces=("key", "size"), correct=("correct", "mean"))
    table = pd.DataFrame({"id": [p.id for p in problems], "prompt": [p.prompt for p in problems],
                          "gold": [p.gold for p in problems]})
    table["traces"] = [int(counts["traces"].get(p.id, 0)) if p.id in counts.index else 0 for p in problems]
    share = [counts["correct"].get(p.id) if p.id in counts.index else None for p in problems]
    table["share correct"] = ["–" if v is None or pd.isna(v) else f"{float(v):.2f}" for v in share]  # never "None"
    st.caption(f"{len(table)} problems. Choose one to open its first trace (a greedy BaseOnly one is made if none).")
    st.dataframe(table, key="problems_set", on_select=lambda: _open_selected_problem(table),
                 selection_mode="single-row", hide_index=True, width="stretch",
                 column_config={"prompt": st.column_config.TextColumn("prompt", width="large"),
                                "share correct": st.column_config.TextColumn(
                                    "share correct", help="Share of this problem's graded traces that are correct "
                                                          "(– when none is graded)")})


def main() -> None:
    ctx = get_context()
    ss = st.session_state
    if ss.pop("_goto_trace", False):
        st.switch_page(TRACE_PAGE, query_params=state.trace_link_params())
    goto = ss.pop("_goto_problem", None)
    if goto is not None:
        found = _first_trace_of(ctx, goto)
        if found:
            state.open_trace(found, goto)
            st.switch_page(TRACE_PAGE, query_params=state.trace_link_params())
    state.show_notice()
    st.title("Problems")
    checking = False
    try:
        bad = resources.deep_check(ctx.settings.store_path).result(resources.DEEP_CHECK_WAIT_S)
        if bad is None:  # still reading: the damaged files the listing found (footers, and files changed since put)
            checking, bad = True, ctx.store.unreadable(deep=False)
    except (ForkpointError, OSError) as err:
        st.warning(f"Could not check the store for damaged traces: {md_escape(err, 400)}")
        bad = []
    tab1, tab2, tab3, tab4 = st.tabs(["Traces", "Problem set", "Notes", "Search"])
    with tab1:
        traces_tab(ctx, bad)
    with tab2:
        problems_tab(ctx)
    with tab3:
        notes_search_tab(ctx.store, ctx.store.summaries())  # app/notes_panel.py
    with tab4:
        search_tab(ctx)  # app/search_panel.py
    unreadable_panel(bad)
    if checking:
        _await_deep_check(ctx.settings.store_path)


@st.fragment(run_every=1.0)
def _await_deep_check(path: str) -> None:
    """While the store's full read goes on: say so, and rerun the page when it is done (its damaged files then
    show)."""
    if resources.deep_check(path).running():
        st.caption("Reading every trace file in full to find damaged ones (a large store takes a few seconds the "
                   "first time)…")
    else:
        st.rerun()


def unreadable_panel(bad: list) -> None:
    """Trace files the store cannot read, with the reason and what to do (nothing is deleted)."""
    if not bad:
        return
    st.warning(f"{len(bad)} trace file(s) in the store cannot be read; they are left out of the tables above. "
               "`forkpoint verify` checks every file; `forkpoint repair` sets damaged ones aside (never deletes).")
    st.dataframe(pd.DataFrame({"file": [str(p) for p, _ in bad], "reason": [" ".join(str(r).split()) for _, r in bad]}),
                 hide_index=True, width="stretch", key="problems_unreadable")


def _first_trace_of(ctx, problem_id: str) -> str | None:
    found = ctx.store.root_of(problem_id)
    if found is not None:
        return found
    if ctx.pair is None:
        st.error("No model pair is loaded, so no trace can be made for this problem.")
        return None
    problem = next((p for p in resources.problem_set(ctx.settings.problems_path) if p.id == problem_id), None)
    if problem is None:
        return None
    try:
        with st.spinner(f"Generating a BaseOnly trace for {problem_id} …"):
            return actions.first_trace(ctx.pair, ctx.store, problem, resources.max_new_tokens(ctx.pair)).key
    except ForkpointError as err:
        st.error(f"Could not generate a trace: {md_escape(err, 400)}")
        return None


main()
