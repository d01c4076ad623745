"""Notes and bookmarks on tokens in the app: the Trace page's notes panel and the Problems page's search.

Thin: reading, adding, deleting and searching are core/io/notes.py; this only draws widgets.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from app import state
from app.view import md_escape
from core.errors import ForkpointError
from core.io import notes as nt
from core.trace import Trace

TRACE_PAGE = Path(__file__).resolve().parent / "screens" / "trace.py"


def _where(note: nt.Note) -> str:
    return f"#{note.start}" if note.start == note.end else f"#{note.start}–{note.end}"


def trace_notes_panel(store, trace: Trace, selected: int | None) -> None:
    """List the open trace's notes (click → select the token; delete) and add one on the selected token(s)."""
    if not trace.key or len(trace) == 0:
        return
    try:
        notes = nt.read_notes(store, trace.key)
    except ForkpointError as err:
        st.warning(str(err))
        notes = []
    with st.expander(f"Notes ({len(notes)})", expanded=bool(notes)):
        for note in notes:
            c1, c2, c3 = st.columns([1, 8, 1])
            if c1.button(_where(note), key=f"note_go_{note.id}", help="select this token"):
                st.session_state["sel_pos"] = note.start
                st.rerun()
            # plain text: a note's Markdown (an image, a link) would make every visit fetch an outside URL
            c2.text(("🔖 " if note.bookmark else "") + (note.text or "(bookmark)"))
            if c3.button("✕", key=f"note_del_{note.id}", help="delete this note"):
                nt.delete_note(store, trace.key, note.id)
                st.rerun()
        _add_form(store, trace, selected)


def _add_form(store, trace: Trace, selected: int | None) -> None:
    last = len(trace) - 1
    start_default = min(max(int(selected), 0), last) if selected is not None else 0
    with st.form(key=f"note_form_{trace.key}", clear_on_submit=True):
        c1, c2, c3 = st.columns([1, 1, 1])
        # no keys: the inputs are new widgets (defaulting to the selection) whenever the selection changes
        start = c1.number_input("From token", 0, last, start_default)
        end = c2.number_input("To token", 0, last, start_default)
        bookmark = c3.checkbox("Bookmark", key="note_bookmark")
        text = st.text_area("Note", key="note_text", placeholder="What happens here?")
        if st.form_submit_button("Add note"):
            try:
                nt.add_note(store, trace.key, int(start), int(max(start, end)), text, bookmark=bookmark,
                            n_tokens=len(trace))
                state.notice("success", f"Note saved on {'token' if start == end else 'tokens'} "
                             f"{int(start)}{'' if start >= end else f'–{int(end)}'}.")
                st.rerun()
            except ForkpointError as err:
                st.error(md_escape(err, 400))


def notes_search_tab(store, summaries: pd.DataFrame) -> None:
    """The Problems page's notes tab: search notes and bookmarks; choose a row to open the trace at the note."""
    c1, c2 = st.columns([4, 1])
    query = c1.text_input("Search notes (text, problem or trace key)", key="notes_query")
    only = c2.toggle("Bookmarks only", key="notes_bookmarks")
    problems = {}
    if not summaries.empty:
        problems = {str(k): ("" if pd.isna(p) else str(p)) for k, p in zip(summaries["key"], summaries["problem"])}
    found, bad = nt.all_notes(store)
    for path, why in bad:
        st.warning(f"Notes file {path} could not be read: {why}")
    rows = nt.search_notes(store, query, bookmarks_only=only, problems=problems)
    if rows.empty:
        st.info("No notes yet: select a token on the Trace page and add one." if not found else "No note matches.")
        return
    shown = rows.assign(where=[f"{s}" if s == e else f"{s}–{e}" for s, e in zip(rows["start"], rows["end"])])
    shown = shown[["problem", "where", "bookmark", "text", "key", "created", "start"]]
    st.caption(f"{len(shown)} note(s); choose a row to open its trace at the note.")
    st.dataframe(shown, key="notes_table", on_select=lambda: _open(shown), selection_mode="single-row",
                 hide_index=True, width="stretch", column_order=["problem", "where", "bookmark", "text", "key", "created"],
                 column_config={"bookmark": st.column_config.CheckboxColumn("🔖"),
                                "text": st.column_config.TextColumn("note", width="large")})


def _open(shown: pd.DataFrame) -> None:
    event = st.session_state.get("notes_table")
    rows = (event or {}).get("selection", {}).get("rows", []) if event else []
    if rows and rows[0] < len(shown):
        row = shown.iloc[rows[0]]
        state.open_trace(str(row["key"]), row["problem"] or None, pos=int(row["start"]))
        st.session_state["_goto_trace"] = True
