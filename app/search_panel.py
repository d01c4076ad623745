"""Search across traces on the Problems page: core.analysis.search over the store, a row opens its trace at
the matched token, and "filter the Traces table" keeps the traces where the match spikes."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import resources, state
from app.view import md_code, md_escape
from core import settings
from core.analysis.search import search_traces, spiking_keys
from core.errors import ForkpointError
from core.scoring.registry import score_label

FILTER_KEY = "search_filter"  # {"pattern": str, "keys": [trace keys]}: the Traces table shows only these


@st.cache_data(show_spinner=False, max_entries=16)
def _search(path: str, stamp: tuple, pattern: str, regex: bool, case: bool, score: str, top: float, rule_key: str,
            _rule) -> pd.DataFrame:
    """One search over the store (cached until a trace is added or removed: `stamp`), on the traces as the
    Trace page annotates them (the sidebar's spike rule, planning tags), so a hit spikes where the view does."""
    traces = [resources.view_trace(path, key, score, rule_key, _rule) for key in resources.get_store(path).keys()]
    return search_traces(traces, pattern, regex=regex, case=case, score=score, top=top)


def search_tab(ctx) -> None:
    """Pattern, options, the table of matches (choose a row to open it at the token) and the filter button."""
    s = ctx.settings
    row = st.container(horizontal=True, wrap=True, vertical_alignment="bottom")  # a fixed fourth cut "Spikes only"
    pattern = row.text_input("Find in every stored response", key="search_pattern", placeholder="e.g.  Wait")
    regex = row.toggle("Regex", key="search_regex")
    case = not row.toggle("Any case", key="search_nocase")
    only = row.toggle("Spikes only", key="search_spikes")
    if not pattern:
        st.caption("A token string (leading spaces count: ' Wait') or a regular expression; each match shows its "
                   f"{md_escape(score_label(s.score))} score, whether it spikes, and the trace's outcome.")
        return
    store = resources.get_store(s.store_path)
    top = s.rule.top or settings.SPIKE_TOP  # a calibrated gate has no top: the default top-p marks spikes here
    try:
        found = _search(s.store_path, tuple(store.keys()), pattern, regex, case, s.score, float(top), s.rule.key(),
                        s.rule)
    except ForkpointError as err:
        st.error(md_escape(err, 400))
        return
    spiking = spiking_keys(found)
    shown = found[found["spike"]] if only else found
    quoted = md_code(repr(pattern))  # ' add', not add: a leading space is part of what is searched
    if shown.empty:
        st.info(f"No {'spiking ' if only and len(found) else ''}match of {quoted} in the store's responses"
                + (f" ({len(found)} without a spike: turn *Spikes only* off)." if only and len(found) else
                   ": try *Any case*, fewer characters, or *Regex*."))
        return
    st.caption(f"{len(shown)} match{'es' if len(shown) != 1 else ''} of {quoted} in "
               f"{shown['key'].nunique()} traces; {int(found['spike'].sum())} on a spike (in {len(spiking)} traces). "
               "Choose a row to open its trace at that token.")
    if st.button(f"Show only the {len(spiking)} traces where it spikes in the Traces table", key="search_filter_btn",
                 disabled=not spiking):
        st.session_state[FILTER_KEY] = {"pattern": pattern, "keys": spiking}
        st.rerun()
    table = shown.reset_index(drop=True)
    st.dataframe(table, key="search_table", on_select=lambda: _open(table), selection_mode="single-row",
                 hide_index=True, width="stretch",
                 column_order=["problem", "match", "pos", "score", "spike", "tag", "source", "correct", "answer",
                               "policy", "key"],
                 column_config={"score": st.column_config.NumberColumn(format="%.3f"),
                                "spike": st.column_config.CheckboxColumn("spike"),
                                "correct": st.column_config.CheckboxColumn("correct"),
                                "key": st.column_config.TextColumn("key", width="small")})


def _open(table: pd.DataFrame) -> None:
    event = st.session_state.get("search_table")
    rows = (event or {}).get("selection", {}).get("rows", []) if event else []
    if rows and rows[0] < len(table):
        row = table.iloc[rows[0]]
        problem = row["problem"]
        state.open_trace(str(row["key"]), None if problem is None or pd.isna(problem) else str(problem),
                         pos=int(row["pos"]))
        st.session_state["_goto_trace"] = True


def apply_search_filter(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a trace table that the active search filter keeps (with a caption and a clear button)."""
    active = st.session_state.get(FILTER_KEY)
    if not active:
        return table
    keys = set(active["keys"])
    c1, c2 = st.columns([5, 1], vertical_alignment="center")
    c1.info(f"Filtered by search: traces where {md_code(active['pattern'])} spikes ({len(keys)}).")
    if c2.button("Clear", key="search_filter_clear"):
        st.session_state[FILTER_KEY] = None
        st.rerun()
    return table[table["key"].astype(str).isin(keys)]
