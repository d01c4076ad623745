"""Export: download the open trace or a filtered set as JSONL, CSV, Parquet or self-contained HTML."""

from __future__ import annotations

import streamlit as st

from app import downloads, resources, state
from app.context import get_context
from app.downloads import export_file_bytes, file_name, mime_type
from app.filters import trace_filter
from app.view import md_code, md_escape, trace_table
from core.errors import ForkpointError
from core.io.notes import attach_notes, notes_stamp
from core.views.exports import FORMATS


@st.cache_data(show_spinner=False, max_entries=2)  # a whole store's file is hundreds of MB: keep the last two
def export_bytes(path: str, keys: tuple[str, ...], fmt: str, score: str, pair_tag: str, rule_key: str,
                 _pair=None, _rule=None, notes_tag: str = "") -> tuple[bytes, list[str]]:
    """(the exported file's bytes, a line per trace left out as unreadable) for stored traces under the sidebar's
    spike rule (cached by keys and settings). Token strings come from the loaded pair only when every trace was
    made with its vocabulary (as on the Trace page); otherwise from the tokenizer the traces record, else "#id"."""
    read, bad = resources.get_store(path).load_all(keys)  # read once, not through the per-trace view cache
    traces = attach_notes(path, read)  # notes travel with the file
    decode = resources.decoder(_pair)
    if decode is not None and any(resources.decoder(_pair, t) is None for t in traces):
        decode = None
    data = export_file_bytes(traces, fmt, score, decode,
                             top=None if _rule is None else _rule.top, gate=None if _rule is None else _rule.gate)
    return data, [f"{p.name}: {why}" for p, why in bad]


def _filtered_keys(ctx) -> tuple[str, ...]:
    table = trace_table(ctx.store.summaries(), ctx.settings.score, ctx.settings.rule)
    if table.empty:
        return ()
    shown = trace_filter(table, "ex")
    st.caption(f"{len(shown)} of {len(table)} traces match.")
    return tuple(shown["key"].astype(str))


def main() -> None:
    ctx = get_context()
    state.show_notice()
    st.title("Export")
    ss = st.session_state
    scope = st.radio("What", ("current", "filtered"), horizontal=True, key="ex_scope",
                     format_func={"current": "the open trace", "filtered": "a filtered set of traces"}.get)
    if scope == "current":
        key = ss.get("trace_key")
        if not key:
            st.info("No trace is open; open one on the Trace or Problems page.")
            return
        keys: tuple[str, ...] = (key,)
        st.caption(f"Trace {md_code(key)}")
    else:
        keys = _filtered_keys(ctx)
        if not keys:
            st.info("No traces match.")
            return
    fmt = st.radio("Format", tuple(FORMATS), horizontal=True, key="ex_format", format_func=lambda f: FORMATS[f].label)
    s = ctx.settings
    name = file_name(keys, fmt)
    tag = "none" if ctx.pair is None else repr(ctx.pair.fingerprint())
    args, notes = (s.store_path, keys, fmt, s.score, tag, s.rule.key()), notes_stamp(s.store_path, keys)
    if len(keys) > downloads.EAGER_MAX and ss.get("ex_prepared") != (args, notes):
        st.caption(f"{len(keys)} traces: the file is made when you ask (a few thousand take a minute or more).")
        st.button(f"Prepare {name}", key="ex_prepare", type="primary", on_click=ss.__setitem__,
                  args=("ex_prepared", (args, notes)))
        return
    try:
        with st.spinner(f"Writing {len(keys)} trace(s) as {FORMATS[fmt].label} …"):
            data, skipped = export_bytes(*args, ctx.pair, s.rule, notes_tag=notes)  # a new note makes a new file
    except ForkpointError as err:
        st.error(f"Export failed: {md_escape(err, 400)}")
        return
    if skipped:
        st.warning(md_escape(f"{len(skipped)} trace(s) could not be read and are left out (`forkpoint verify` "
                             f"checks the store): {'; '.join(skipped[:3])}", 600))
    st.download_button(f"Download {name}", data=data, file_name=name, mime=mime_type(fmt), type="primary",
                       key="ex_download", on_click="ignore")
    st.caption(f"{len(data) / 1024:.1f} KiB · every file carries each trace's reproducibility record, the spikes "
               f"({s.rule.describe()}), planning tags and both top-k lists as token strings.")


main()
