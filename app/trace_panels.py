"""The Trace page's parts: header, token panel (a fragment), score plot, branch comparison and tree; the
selection panel is `app/selection_panel.py`, the queued-branch runner `app/branch_runner.py`."""

from __future__ import annotations

from functools import partial
from typing import Any

import pandas as pd
import streamlit as st

from app import live, resources, state
from app.branch_panels import compare_panel, compared, graph_panel
from app.components.token_view import token_view
from app.context import Context, get_context
from app.figures import trace_figure
from app.instruments_panels import trace_instruments
from app.notes_panel import trace_notes_panel
from app.selection_panel import selection_panel
from app.switchboard import (
    EXTRAS,
    GRAPH,
    PLOT,
    VIEW,
    VIEW_KEY,
    live_offer,
    matter_strip,
    on_click,
    remember,
    run_switch_job,
    switch_controls,
    switch_list,
)
from app.view import annotate_view, md_code, md_escape
from core.analysis.tables import first_token_artifact
from core.errors import ForkpointError
from core.instruments.effects import effects_stamp
from core.io.notes import notes_stamp
from core.scoring.registry import METRICS, score_values
from core.trace import Trace
from core.views.heatmap import heatmap_css, legend_html, value_range
from core.views.legend import SWITCH_POINT
from core.views.presentation import (
    PAGE_TOKENS,
    outcome_line,
    page_bounds,
    policy_text,
    flip_changes,
    switch_text,
)
from core.views.token_payload import view_payload as token_payload




def header(trace: Trace, rule_text: str) -> None:
    """Problem text, the trace's vital numbers and the legend."""
    problem = trace.meta.get("problem") or {}
    st.markdown(f"#### Problem {md_code(problem.get('id') or '(ad hoc)')}")
    st.text(problem.get("prompt") or "")
    policy = policy_text((trace.meta.get("policy") or {}).get("name"), trace.meta.get("kind"), trace.meta.get("parent"))
    switched = len(trace.meta.get("switches") or {})
    if switched:
        policy += f" ⇄{switched}"  # the policy decides everywhere but at the switched positions
    takeovers = trace.n_takeovers
    row = st.container(horizontal=True, wrap=True, gap="medium")  # wraps on a narrow window: nothing cut
    row.metric("Tokens", len(trace), width="content")
    row.metric("Policy", policy.split(" · ")[0], help=policy if " · " in policy else None, width="content")
    row.metric("Takeovers", takeovers, width="content")
    row.metric("Switch points", len(flip_changes(trace)), width="content",
               help=f"Tokens where the other model's top token is another one (dotted underline): {SWITCH_POINT}; "
                    "elsewhere a flip changes nothing. n / p walk them.")
    row.metric(f"Spikes ({rule_text})", len(trace.spike_positions), width="content")
    row.metric("Gold", md_escape(problem.get("gold"), 40) if problem.get("gold") is not None else "–", width="content")
    switched = switch_text(trace)  # the outcome line (answer, ✓/✗, ρ) sits above the text, in the token view
    if switched or trace.meta.get("parent"):
        st.caption(" · ".join(([md_escape(switched, 200)] if switched else [])
                              + ([f"from {md_code(str(trace.meta.get('parent'))[:8])}"] if trace.meta.get("parent") else [])))


PLOT_KEY = "score_plot"  # one chart for every open trace: a new trace updates it in place, never remounts it
PLOT_HEIGHT = 260  # px: the score plot, and the room kept for it before it draws


def _on_plot() -> None:
    """A click on a point of the score plot selects that token (the text and the extras rerun, the plot not)."""
    event = st.session_state.get(PLOT_KEY)
    points = (event or {}).get("selection", {}).get("points", []) if event else []
    for point in points:
        pos = point.get("customdata", point.get("x"))
        if isinstance(pos, list):
            pos = pos[0] if pos else None
        if pos is not None:
            st.session_state["sel_pos"] = int(pos)
            break
    st.rerun([VIEW, EXTRAS])


def colour_range(ctx: Context, trace: Trace, others: tuple[Trace, ...] | list[Trace] = ()
                 ) -> tuple[float | None, float | None, str, str]:
    """(vmin, vmax, what the range is, cache tag) for the main view: with traces side by side (`others`), the
    range of all of them (so a token has one colour in every view); else the range the sidebar asks for."""
    s = ctx.settings
    values = score_values(trace.metrics, s.score)
    if others:
        lo, hi = value_range(values, *(score_values(t.metrics, s.score) for t in others))
        return lo, hi, "shared with the traces side by side", "cmp:" + ",".join(t.key for t in others)
    if s.crange == "pair" and METRICS[s.score].sign < 0:  # −Δlog p goes below 0: no fixed 0..max range
        lo, hi = value_range(values)
        return lo, hi, "this trace's own range (a fixed range needs a score that is never negative)", "trace"
    if s.crange == "pair":
        df = ctx.store.summaries()
        col = f"max_{s.score}"
        mine = df[df["key"] == trace.key] if not df.empty else df
        if not mine.empty and col in df.columns:
            rows = df[df["pair"] == mine.iloc[0]["pair"]]
            hi = pd.to_numeric(rows[col], errors="coerce").max()
            if hi == hi:
                return 0.0, float(hi), f"fixed 0..{float(hi):.3g} over {len(rows)} traces of this pair", f"pair:{hi}"
    lo, hi = value_range(values)
    return lo, hi, "this trace's own range", "trace"


def trace_page(rule_text: str) -> None:
    """The Trace page below its notices: header and controls, the text (left) beside the switches and the
    selection (right), the score plot under the text, the branch graph and the extras (notes, instruments)
    below. Four fragments (app/switchboard.py names them), each rerun by key only when what it draws changed:
    a switch redraws all of them, a selection the text and the extras, never the plot or the graph.

    Each fragment is the only thing in its own slot. A fragment run drops that fragment's deltas still queued on
    the server (Streamlit's ForwardMsgQueue.clear), so a run right after a page's first one (the view's "drawn",
    a click while the page loads) on a busy machine dropped the graph's container while the extras after it were
    sent: the browser got a block at an index past its parent's end and blanked the page ("Bad delta path
    index"). Alone in a slot, a dropped fragment leaves nothing after it to arrive out of place."""
    top = st.container()
    left, right = st.columns([3, 2], gap="medium")
    view_slot, plot_slot, side = left.container(), left.container(), right.container()
    graph_slot, extras_slot = st.container(), st.container()
    with view_slot:
        view_panel(rule_text, top, side)
    with plot_slot:
        plot_panel()
    with graph_slot:
        graph_fragment()
    with extras_slot:
        extras_panel()


def _open_trace(ctx: Context) -> Trace | None:
    """The open trace, annotated as the sidebar asks (cached per key; None with the reason shown)."""
    s = ctx.settings
    try:
        return resources.view_trace(s.store_path, st.session_state["trace_key"], s.score, s.rule.key(), s.rule)
    except ForkpointError as err:
        st.error(md_escape(err, 400))
        return None


@st.fragment(key=PLOT)
def plot_panel() -> None:
    """The open trace's score plot (its data: the trace and the score; a click on a point selects the token).
    Not before the session's token view has drawn (`charts_ready`): its room is kept."""
    ctx = get_context()
    trace = _open_trace(ctx)
    if trace is None:
        return
    if not charts_ready():
        st.container(height=PLOT_HEIGHT, border=False)
        return
    st.plotly_chart(trace_figure(trace, ctx.settings.score, PLOT_HEIGHT), key=PLOT_KEY, on_select=_on_plot,
                    selection_mode="points", config={"displayModeBar": False})


@st.fragment(key=GRAPH)
def graph_fragment() -> None:
    """The branch graph of the open trace's tree (its data: the tree and which node is open)."""
    ctx = get_context()
    trace = _open_trace(ctx)
    if trace is not None and charts_ready():
        graph_panel(ctx, trace)


def charts_ready() -> bool:
    """Whether this session's token view has drawn (it says so once, app/switchboard.py). Until then the page
    sends no Plotly chart: in a fresh browser, Plotly's 4.8 MB bundle, fetched and compiled for the first chart,
    held the token view's own script back by 1.5-2.7 s (benchmarks/RESULTS.md, "Switchboard")."""
    return bool(st.session_state.get(state.CHARTS_KEY))


@st.fragment(key=EXTRAS)
def extras_panel() -> None:
    """Notes and bookmarks, and the instruments (their data: the open trace and the selected token)."""
    ctx = get_context()
    trace = _open_trace(ctx)
    if trace is None:
        return
    sel = st.session_state.get("sel_pos")
    trace_notes_panel(ctx.store, trace, sel if sel is not None and 0 <= sel < len(trace) else None)
    trace_instruments(ctx, trace)  # takeover effects, success curve, lens (app/instruments_panels.py)


@st.fragment(key=VIEW)
def view_panel(rule_text: str, top, side) -> None:
    """Header and switchboard (into `top`), token view and comparison (here), switch list and selection panel
    (into `side`): a click (select, flip, force, back / forward) reruns this fragment, and a switch streams its
    new tokens in place."""
    ss = st.session_state
    ctx = get_context()
    s = ctx.settings
    # The token view's place is a container, never an st.empty filled in the same run: the empty's delta, drawn
    # alone before the view's own (the browser renders between websocket messages), unmounted the view, and the
    # text vanished for 0.1-0.7 s on a switch. Only a queued switch (the rerun path) streams into an empty first.
    view_slot = st.container()
    if ss.get("switch_job"):
        stream = view_slot.empty()
        run_switch_job(ctx, stream)
        stream.empty()
    key = ss["trace_key"]
    remember(key)
    try:
        trace = resources.view_trace(s.store_path, key, s.score, s.rule.key(), s.rule)
        lo, hi, note, tag = colour_range(ctx, trace, compared(ctx, trace))
        reference = _reference(ctx, trace) if s.scale == "rank" and tag.startswith("cmp:") else None
        sel = ss.get("sel_pos")
        if sel is not None and not 0 <= sel < len(trace):
            sel = ss["sel_pos"] = None
        start, end = _page(len(trace), sel)
        data = resources.render_data(s.store_path, key, s.score, s.scale, s.rule.key(), _pair_tag(ctx), s.rule,
                                     ctx.pair, lo, hi, tag, reference, start, end, notes_stamp(s.store_path, [key]),
                                     effects_stamp(ctx.store, key))
    except ForkpointError as err:
        st.error(md_escape(err, 400))
        return
    mode = ss.get("click_mode", "flip") if ctx.pair is not None else "select"
    data["mode"] = mode
    data["help"] = {"flip": "Click a token (or ← → and Enter) to flip its takeover: the response re-flows · dotted: "
                            f"{SWITCH_POINT} (n / p) · hover: both models' top-k, click one to force it",
                    "edit": "Click a token (or ← → and Enter), type, Enter: the base continues from your text · "
                            "Escape cancels",
                    "select": "Hover a token for both models' top-k · click to select · n / p: next / previous spike",
                    }.get(mode, "") + " · ? keys"
    data["outcome"], data["key"] = outcome_line(trace), key
    hist, i = ss.get("sw_hist") or [], int(ss.get("sw_i") or 0)
    data["nav"] = {"back": i > 0, "fwd": i < len(hist) - 1}
    data["go"] = ss.get(state.GO_KEY)
    data["history"] = True  # the app: b / f move the browser's history (the URL follows, app/state.py)
    data["note"] = ss.pop("sw_note", None)
    data["max_typed"] = live.MAX_TYPED
    data["charts_waiting"] = not charts_ready()  # the view says when it has drawn: the charts follow
    live_ok = mode in ("flip", "edit") and (start, end) == (0, len(trace))
    if live_ok:
        resources.warm_up()  # what the first switch's grading loads, loaded while the user reads
        live.warm(ctx.pair, trace)  # and the trace's model states, so its first switch resumes as later ones
    data["live"] = live_offer(ctx, trace, partial(live_render, ctx)) if live_ok else None
    with view_slot:
        token_view(data, selected=sel, key=VIEW_KEY, on_click=on_click, prob_mode=s.prob_mode)
    # the header above is sent after the text: a fresh browser fetches the token view's code first (the
    # metrics' and widgets' code is many more files), so the text is drawn first
    with top:
        header(trace, rule_text)
        if first_token_artifact(trace, s.score):
            st.warning("The largest spike is at token #0: the reasoner's chat template usually expects a thinking "
                       "tag there, so position 0 measures the template, not the reasoning. Read it with care.")
        switch_controls(ctx, trace)
        legend = legend_html(trace.annotations.get("tags"), score=s.score, vmin=lo, vmax=hi, scale=s.scale,
                             spike_rule=s.rule.describe(), range_note=note, effects=bool(data["hover"]["effects"]))
        st.html(f"<style>{heatmap_css()}</style>{legend}")
        matter_strip(trace)
    compare_panel(ctx, trace, lo, hi, reference)  # right under the text, where the eye is
    with side:
        switch_list(trace)
        selection_panel(ctx, trace, sel)
    state.write_query_params()
    ss[state.GO_KEY] = None  # made once, by the token view just drawn




def live_render(ctx: Context, child: Trace) -> dict[str, Any]:
    """The token view's payload for a trace the live channel (app/live.py) just made: what this fragment's
    next run draws for it (render_data of an unpaged trace, nothing side by side), so that run changes
    nothing on screen."""
    s = ctx.settings
    trace = annotate_view(child, s.score, s.rule)
    trace = resources.marked(s.store_path, trace, s.score, effects=None)  # the store read once, then drawn
    lo, hi, _, _ = colour_range(ctx, trace)
    view = token_payload(trace, score=s.score, scale=s.scale, decode=resources.decoder(ctx.pair, trace), vmin=lo,
                         vmax=hi)
    return {**{k: v for k, v in view.items() if k != "legend"}, "outcome": outcome_line(trace), "key": trace.key}


def _page(n: int, sel: int | None) -> tuple[int, int]:
    """The token view's page of a long trace (PAGE_TOKENS per page): the selected token's page, else the
    one chosen; a slider appears only when there is more than one page."""
    ss = st.session_state
    pages = -(-n // PAGE_TOKENS)
    if pages <= 1:
        return 0, n
    ss.setdefault("tok_page", 1)
    ss["tok_page"] = max(1, min(int(ss["tok_page"]), pages))
    if sel is not None and sel // PAGE_TOKENS + 1 != ss["tok_page"]:  # a selection (plot click, n/p, URL) leads
        ss["tok_page"] = sel // PAGE_TOKENS + 1
    st.select_slider(f"Tokens shown ({PAGE_TOKENS} per page; the plot shows all {n})", range(1, pages + 1),
                     key="tok_page", format_func=lambda p: f"{(p - 1) * PAGE_TOKENS}–{min(n, p * PAGE_TOKENS) - 1}",
                     on_change=lambda: ss.update(sel_pos=None))
    return page_bounds(n, int(ss["tok_page"]) - 1)


def _reference(ctx: Context, trace: Trace):
    """Both traces' scores pooled: the rank scale's reference while a comparison is open."""
    import numpy as np

    return tuple(np.concatenate([np.asarray(score_values(t.metrics, ctx.settings.score), dtype=float)
                                 for t in (trace, *compared(ctx, trace))]).tolist())


def _pair_tag(ctx: Context) -> str:
    return "none" if ctx.pair is None else repr(ctx.pair.fingerprint())
