"""The trace filter row (search, policy, kind, correct) that the Problems and Export pages share, and the
Problems table's subset chip (the traces of a bar clicked on the Dataset page's histogram)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.view import CORRECT_FILTERS, filter_table, md_escape

SUBSET_KEY = "pf_subset"  # session: {"label": "ρ in [0.1, 0.2)", "keys": [...]} or None


def trace_filter(table: pd.DataFrame, prefix: str) -> pd.DataFrame:
    """Draw the filter widgets (session keys `{prefix}_text`, `_policy`, `_kind`, `_correct`) and return
    the rows of `table` (a `trace_table`) they keep."""
    c1, c2, c3, c4 = st.columns([3, 2, 2, 1])
    text = c1.text_input("Search problem / prompt", key=f"{prefix}_text")
    policies = c2.multiselect("Policy", sorted(table["policy"].dropna().unique()), key=f"{prefix}_policy")
    kinds = c3.multiselect("Kind", sorted(table["kind"].dropna().unique()), key=f"{prefix}_kind")
    correct = c4.selectbox("Correct", CORRECT_FILTERS, key=f"{prefix}_correct")
    return filter_table(table, text, policies, kinds, correct)


def subset_filter(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of `table` among the traces a Dataset histogram bar chose, under a removable chip saying
    which ("ρ in [0.1, 0.2): 14 traces ×"); `table` itself when no bar is chosen."""
    subset = st.session_state.get(SUBSET_KEY)
    if not subset:
        return table
    keys = set(subset["keys"])
    st.button(f"{md_escape(subset['label'])}: {len(keys)} traces  ✕", key="pf_subset_clear", type="primary",
              icon=":material/filter_alt:", help="Chosen on the Dataset page's histogram; click to remove the filter",
              on_click=lambda: st.session_state.update({SUBSET_KEY: None}))
    return table[table["key"].astype(str).isin(keys)]
