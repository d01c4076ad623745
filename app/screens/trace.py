"""Trace: the response as a heatmap; hover for both models' top-k, click a token to take over there."""

from __future__ import annotations

import streamlit as st

from app import actions, resources, state
from app.branch_runner import run_pending
from app.context import Context, get_context
from app.trace_panels import trace_page
from app.view import md_escape
from core.errors import ForkpointError


def ensure_trace(ctx: Context) -> str | None:
    """The key of the trace to show: the open one, the URL problem's root, or on the first view the store's most
    recent trace (None: nothing to show; nothing is generated unasked)."""
    ss = st.session_state
    key = ss.get("trace_key")
    if key:
        if key in ctx.store:
            return key
        damage = ctx.store.damage_of(key)
        if damage is not None:
            st.error(f"Trace {md_escape(key)} is damaged: {md_escape(damage, 300)}. Run `forkpoint verify` to check "
                     "the store and `forkpoint repair` to set damaged files aside (nothing is deleted); re-running "
                     "what made it recomputes it.")
        else:
            st.warning(f"Trace {md_escape(key)} is not in the store {md_escape(ctx.settings.store_path)}.")
        state.open_trace(None)
        return None
    if ss.get("problem_id"):
        found = ctx.store.root_of(ss["problem_id"])
        if found:
            state.open_trace(found, ss["problem_id"])
        ss["first_view"] = False
        return found  # None: a link to a problem with no trace yet (the empty state offers to generate it)
    if not ss.get("first_view"):
        return None
    ss["first_view"] = False
    recent = _most_recent(ctx)  # the first view: what the user made last, never a generation unasked
    if recent:
        state.open_trace(recent, None)
    return recent


def _most_recent(ctx: Context) -> str | None:
    """The store's most recently created trace (None in an empty store)."""
    rows = ctx.store.summaries()
    return None if rows.empty else str(rows.iloc[-1]["key"])


def empty_state(ctx: Context) -> None:
    """No trace open (an empty store, or a link to a problem with no trace): the problem list and one action,
    generate a greedy base-model trace of the chosen problem (the only thing that writes to the store here)."""
    ss = st.session_state
    try:
        problems = resources.problem_set(ctx.settings.problems_path)
    except ForkpointError as err:
        st.error(f"Could not read the problems: {md_escape(err, 400)}")
        return
    recent = _most_recent(ctx)
    if recent is None:
        st.markdown("#### No trace yet")
        st.caption("Pick a problem and let the base model answer it (greedy); then click its tokens to switch the "
                   "reasoner on where it disagrees. Other policies and whole problem sets: **Generate**. Traces made "
                   "before: **Problems**.")
    else:  # e.g. a link to a trace or problem this store does not hold
        st.markdown("#### No trace open")
        st.caption(f"The store holds {len(ctx.store.summaries())} traces: open one on **Problems**, or the most "
                   "recent one here; or pick a problem below and let the base model answer it (greedy).")
        st.button("Open the most recent trace", key="first_recent", on_click=state.open_trace, args=(recent, None))
    if not problems:
        st.info("The problem set is empty.")
        return
    ids = [p.id for p in problems]
    wanted = ss.get("problem_id")
    if wanted and wanted not in ids:
        st.error(md_escape(f"No problem {wanted!r} in the problem set", 400))
    index = ids.index(wanted) if wanted in ids else 0
    pick = st.selectbox(f"Problem ({len(problems)} in the set)", range(len(problems)), index=index, key="first_problem",
                        format_func=lambda i: f"{problems[i].id}: {problems[i].prompt[:90]}")
    go = st.button("Generate", type="primary", disabled=ctx.pair is None, key="first_generate",
                   help="The base model answers the problem alone (greedy) and the trace is stored.")
    if ctx.pair is None:
        st.caption("Load a model pair (sidebar) to generate.")
    if go:
        problem = problems[int(pick)]
        try:
            with st.spinner(f"Generating a trace of problem {problem.id} …"):
                trace = actions.first_trace(ctx.pair, ctx.store, problem, resources.max_new_tokens(ctx.pair))
        except ForkpointError as err:
            st.error(f"Could not generate a trace: {md_escape(err, 400)}")
            return
        state.open_trace(trace.key, problem.id)
        st.rerun()


def main() -> None:
    ctx = get_context()
    run_pending(ctx)
    state.show_notice()
    key = ensure_trace(ctx)
    if key is None:
        empty_state(ctx)
        state.write_query_params()
        return
    s = ctx.settings
    try:
        trace = resources.view_trace(s.store_path, key, s.score, s.rule.key(), s.rule)
    except ForkpointError as err:
        st.error(f"Could not open trace {md_escape(key)}: {md_escape(err, 400)}")
        return
    if st.session_state.get("problem_id") is None:
        st.session_state["problem_id"] = (trace.meta.get("problem") or {}).get("id")
    trace_page(s.rule.describe())


main()
