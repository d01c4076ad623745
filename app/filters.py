"""The trace filter row (search, policy, kind, correct) that the Problems and Export pages share."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.view import CORRECT_FILTERS, filter_table


def trace_filter(table: pd.DataFrame, prefix: str) -> pd.DataFrame:
    """Draw the filter widgets (session keys `{prefix}_text`, `_policy`, `_kind`, `_correct`) and return
    the rows of `table` (a `trace_table`) they keep."""
    c1, c2, c3, c4 = st.columns([3, 2, 2, 1])
    text = c1.text_input("Search problem / prompt", key=f"{prefix}_text")
    policies = c2.multiselect("Policy", sorted(table["policy"].dropna().unique()), key=f"{prefix}_policy")
    kinds = c3.multiselect("Kind", sorted(table["kind"].dropna().unique()), key=f"{prefix}_kind")
    correct = c4.selectbox("Correct", CORRECT_FILTERS, key=f"{prefix}_correct")
    return filter_table(table, text, policies, kinds, correct)
