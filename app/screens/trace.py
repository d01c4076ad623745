"""Trace: the response as a heatmap; hover for both models' top-k, click a token to take over there."""

from __future__ import annotations

import streamlit as st

from app import actions, resources, state
from app.context import Context, get_context
from app.trace_panels import run_pending, trace_panel
from app.view import md_escape
from core.errors import ForkpointError, InvalidInputError


def _first_problem(ctx: Context):
    """The URL's problem (InvalidInputError if the set has no such id)."""
    wanted = st.session_state.get("problem_id")
    found = next((p for p in resources.problem_set(ctx.settings.problems_path) if p.id == wanted), None)
    if found is None:
        raise InvalidInputError(f"No problem {wanted!r} in the problem set")  # escaped once, where it is shown
    return found


def ensure_trace(ctx: Context) -> str | None:
    """The key of the trace to show: the open one, the URL problem's, or a fresh first-view trace."""
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
            return found
    if not ss.get("first_view") and not ss.get("problem_id"):
        return None
    ss["first_view"] = False
    if ctx.pair is None:
        return None
    limit = resources.max_new_tokens(ctx.pair)
    try:
        if ss.get("problem_id"):  # a link to a problem with no trace yet
            problem = _first_problem(ctx)
            with st.spinner(f"Generating a first trace for problem {problem.id} …"):
                trace = actions.first_trace(ctx.pair, ctx.store, problem, limit)
        else:
            problems = resources.problem_set(ctx.settings.problems_path)
            with st.spinner("Generating first traces (greedy, base model alone) …"):
                trace = actions.showcase_trace(ctx.pair, ctx.store, problems, max_new_tokens=limit)
    except ForkpointError as err:
        st.error(f"Could not generate a first trace: {md_escape(err, 400)}")
        return None
    state.open_trace(trace.key, (trace.meta.get("problem") or {}).get("id"))
    return trace.key


def main() -> None:
    ctx = get_context()
    run_pending(ctx)
    state.show_notice()
    key = ensure_trace(ctx)
    if key is None:
        st.info("No trace open. Choose one on the **Problems** page, or make some on **Generate**.")
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
    trace_panel(s.rule.describe())


main()
