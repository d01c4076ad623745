"""The Trace page's switchboard: a click flips a takeover (or forces a hover-card alternative) and the
response re-flows in place, streamed token by token (over the live route, app/live.py, when the server has
it; else inside this fragment's rerun); back / forward through the switch states; the list of switches in
force; "which takeovers matter". Plain calls into `core.decoding.takeover`.
"""

from __future__ import annotations

import html
import secrets
import time
from collections.abc import Callable
from typing import Any

import streamlit as st

from app import live, resources, state
from app.context import Context
from app.view import md_escape
from core.decoding.takeover import switches_in_force
from core.errors import ForkpointError
from core.instruments.ablation import ablate_takeovers
from core.record.typed import typed_runs
from core.trace import Trace
from core.views.token_payload import stream_html, stream_prefix

VIEW_KEY = "tokview"  # the token view's widget key: its .click carries the event
# The Trace page's fragments (app/trace_panels.py), each rerun by key only when what it draws changed
VIEW, PLOT, GRAPH, EXTRAS = "fp-view", "fp-plot", "fp-graph", "fp-extras"
FRAGMENTS = (VIEW, PLOT, GRAPH, EXTRAS)

CLICK_MODES = {"flip": "flips the takeover", "edit": "types there", "select": "selects it"}
THEN_LABELS = {"policy": "the trace's policy", "base": "the base model", "reason": "the reasoning model"}


def rerun_after(before: tuple[str | None, int | None], after: tuple[str | None, int | None]) -> list[str]:
    """The Trace page's fragments an event must rerun, from the open (trace, selected token) before and after
    it: every one when the open trace changed (its plot, graph and extras are another trace's); the text and
    the extras (notes and lens at the selection) when only the selection moved; else the text alone. The
    score plot and the branch graph never rerun for a selection."""
    if before[0] != after[0]:
        return list(FRAGMENTS)
    if before[1] != after[1]:
        return [VIEW, EXTRAS]
    return [VIEW]


def on_click() -> None:
    """A click in the token view: select the token, flip its switch (switchboard mode), force a top-k
    alternative (a click in the hover card), or move through the switch history (keys b / f outside the app);
    then rerun only the fragments whose data changed. The view's first draw in a session says so once
    (`{"drawn": true}`): then the charts (app/trace_panels.charts_ready)."""
    ss = st.session_state
    event = ss[VIEW_KEY].click
    if isinstance(event, dict) and event.get("drawn"):  # the session's first view is on screen: now the charts
        ss[state.CHARTS_KEY] = True
        st.rerun([PLOT, GRAPH])
        return
    before = (ss.get("trace_key"), ss.get("sel_pos"))
    _apply_click(event)
    # a queued switch (the rerun path, without the live route) changes the open trace in the view's run
    keys = list(FRAGMENTS) if ss.get("switch_job") else rerun_after(before, (ss.get("trace_key"), ss.get("sel_pos")))
    st.rerun(keys)


def _apply_click(event: Any) -> None:
    ss = st.session_state
    if not isinstance(event, dict):
        return
    if event.get("nav") in (-1, 1):
        _navigate(int(event["nav"]))
        return
    if event.get("opened"):  # the live channel (app/live.py) made and stored this child and drew it already
        _open_child(str(event["opened"]), event.get("pos"))
        return
    if event.get("pos") is None:
        return
    pos = int(event["pos"])
    ss["sel_pos"] = pos
    if isinstance(event.get("same"), str):  # the live channel's no-op switch: said again by the view's rerun
        ss["sw_note"] = event["same"][:300]
    if isinstance(event.get("text"), str) and event["text"]:
        ss["switch_job"] = {"pos": pos, "text": event["text"][: live.MAX_TYPED],
                            "cut": max(0, len(event["text"]) - live.MAX_TYPED)}
    elif event.get("token") is not None:
        ss["switch_job"] = {"pos": pos, "token": int(event["token"])}
    elif ss.get("click_mode", "flip") == "flip" and not event.get("key"):  # n / p select a spike, never flip
        ss["switch_job"] = {"pos": pos}


def _navigate(step: int) -> None:
    """Back / forward through the switch states of this visit (each one a stored trace)."""
    ss = st.session_state
    hist, i = ss.get("sw_hist") or [], int(ss.get("sw_i") or 0)
    j = i + step
    if 0 <= j < len(hist):
        ss["sw_i"] = j
        ss["trace_key"] = hist[j]
        ss["sel_pos"] = None
        # the token view moves the browser's history one step (the URL follows): browser Back is this button
        ss[state.GO_KEY] = {"step": step, "id": time.time_ns()}


def _nav_button(step: int) -> None:
    """◀ back / forward ▶: the switch state before / after this one, the whole trace view redrawn."""
    _navigate(step)
    st.rerun(list(FRAGMENTS))


def remember(key: str) -> None:
    """Keep the switch history in step with the open trace (a trace opened elsewhere starts a new one)."""
    ss = st.session_state
    hist, i = ss.get("sw_hist") or [], int(ss.get("sw_i") or 0)
    if hist and 0 <= i < len(hist) and hist[i] == key:
        return
    if key in hist:  # the occurrence nearest the open state (a state can recur: flipped on, off, on)
        ss["sw_i"] = min((j for j, k in enumerate(hist) if k == key), key=lambda j: abs(j - i))
        return
    ss["sw_hist"], ss["sw_i"] = [key], 0


def _open_child(key: str, pos: Any = None) -> None:
    """Make a switch's child the open trace: a new state in the history (and the URL), the selection on the
    switched token."""
    ss = st.session_state
    if key != ss.get("trace_key"):
        _push(key)
        ss["trace_key"] = key
        ss["compare"] = None
    ss["sel_pos"] = int(pos) if isinstance(pos, int) else None


def live_offer(ctx: Context, trace: Trace, render: Callable[[Trace], dict[str, Any]]) -> dict[str, Any] | None:
    """Register this session with the live channel and return what the token view needs to use it (None when
    this server has no live route or no pair is loaded: clicks then go through a fragment rerun)."""
    if ctx.pair is None or not live.serving():
        return None
    ss = st.session_state
    session = ss.get("live_session") or ss.setdefault("live_session", secrets.token_urlsafe(18))
    live.SESSIONS.put(session, live.LiveView(pair=ctx.pair, store=ctx.store, then=ss.get("sw_then", "policy"),
                                             decode=resources.decoder(ctx.pair, trace), render=render))
    base = (st.get_option("server.baseUrlPath") or "").strip("/")
    return {"url": f"/{base}{live.ROUTE}" if base else live.ROUTE, "session": session, "key": trace.key}


def _push(key: str) -> None:
    ss = st.session_state
    hist, i = ss.get("sw_hist") or [], int(ss.get("sw_i") or 0)
    ss["sw_hist"] = hist[: i + 1] + [key]
    ss["sw_i"] = len(ss["sw_hist"]) - 1


def _queue_switches(wanted: dict) -> None:
    st.session_state["switch_job"] = {"wanted": {int(p): w for p, w in wanted.items()}}
    st.rerun(list(FRAGMENTS))  # the view's run applies it; the plot, graph and extras then show the child


def run_switch_job(ctx: Context, slot) -> None:
    """Apply a queued switch to the open trace, streaming the new continuation into `slot` (the place of the
    token view); the child becomes the open trace (a new entry in the history and the URL)."""
    ss = st.session_state
    job = ss.pop("switch_job", None)
    if not job or ctx.pair is None:
        if job:
            st.warning("Load a model pair (sidebar) to switch takeovers.")
        return
    s = ctx.settings
    try:
        parent = resources.load_trace(s.store_path, ss["trace_key"])
        typed = ctx.pair.encode(job["text"]) if job.get("text") else None
        if job.get("text") and not typed:
            raise ForkpointError(f"The typed text {job['text'][:40]!r} has no tokens")
        wanted = job["wanted"] if "wanted" in job else live.switch_request(parent, int(job["pos"]), job.get("token"),
                                                                          typed)
        child = _stream(ctx, parent, wanted, slot)  # core decides a no-op without decoding where it can
    except ForkpointError as err:
        st.error(f"Could not switch: {md_escape(err, 400)}")
        return
    if child.key == parent.key:  # a switch that changes no token: no new trace, no history step
        if "pos" in job:
            ss["sw_note"] = live.same_text(parent, int(job["pos"]), job.get("text"), resources.decoder(ctx.pair, parent))
        return
    _open_child(child.key, ss.get("sel_pos"))
    if typed:
        ss["sw_note"] = live.typed_note(child, int(job["pos"]), len(typed), job.get("cut", 0))


def _stream(ctx: Context, parent: Trace, wanted: dict, slot) -> Trace:
    """The live channel's `run_switch` with each new token shown in `slot` as it is decided (escaped text, at
    most ~20 updates/s, drawn as the token view draws a live stream): the rerun path, without the live route."""
    start: list[int] = []
    new: list[str] = []
    last = [0.0]
    decode = resources.decoder(ctx.pair, parent)
    prefix: list[str] = []  # the parent's tokens before the switch, drawn once as the token view draws them

    def show(done: bool = False) -> None:
        if not prefix:
            prefix.append(stream_prefix(parent, start[0] if start else 0, score=ctx.settings.score,
                                        scale=ctx.settings.scale, decode=decode))
        slot.html(stream_html(parent, start[0] if start else 0, "".join(new), done=done, prefix=prefix[0]))

    def on_text(pos: int, text: str) -> None:
        if not start:
            start.append(pos)
        new.append(text)
        now = time.perf_counter()
        if now - last[0] > 0.05:  # the first token shows at once, then ~20 updates a second
            last[0] = now
            show()

    view = live.LiveView(pair=ctx.pair, store=ctx.store, then=st.session_state.get("sw_then", "policy"),
                         decode=decode)
    child = live.run_switch(view, parent, wanted, on_text)
    return parent if child.key == parent.key else live.keep(view, child)  # a no-op switch: core gives the parent


def switch_controls(ctx: Context, trace: Trace) -> None:
    """What a click does, who decides after a switch, back / forward, and "which takeovers matter"."""
    ss = st.session_state
    row = st.container(horizontal=True, wrap=True, vertical_alignment="bottom", gap="small")  # wraps, never cuts
    row.segmented_control("Click on a token", list(CLICK_MODES), format_func=CLICK_MODES.get, key="click_mode",
                          required=True,  # a click on the chosen mode keeps it (it turned every mode off)
                          help="Flip: a base token becomes the reasoner's takeover, a takeover the base's choice "
                               "again, and the response re-flows from there. Type: put the cursor at a token, type "
                               "your own text, Enter: the model continues from it. A click on an alternative in "
                               "the hover card forces that token.")
    row.selectbox("After a switch, the rest is written by", list(THEN_LABELS), format_func=THEN_LABELS.get,
                  key="sw_then", width=260)
    hist, i = ss.get("sw_hist") or [], int(ss.get("sw_i") or 0)
    history_nav = row.container(horizontal=True, gap="small", width="content")  # back and forward wrap together
    history_nav.button("◀ back", key="sw_back", disabled=i <= 0, on_click=_nav_button, args=(-1,),
                       help="The previous switch state (key b, or the browser's Back)")
    history_nav.button("forward ▶", key="sw_fwd", disabled=i >= len(hist) - 1, on_click=_nav_button, args=(1,),
                       help="The next switch state (key f, or the browser's Forward)")
    if row.button("Which takeovers matter?", key="sw_matter", disabled=ctx.pair is None or not trace.n_takeovers,
                  help="Switch each takeover off in turn and see whether the answer still holds."):
        bar = st.progress(0.0, text="switching each takeover off …")
        try:
            ss.setdefault("sw_matter_tables", {})[trace.key] = ablate_takeovers(
                ctx.pair, trace, store=ctx.store, progress=lambda d, n: bar.progress(d / max(n, 1),
                                                                                     text=f"{d} / {n} takeovers"))
        except ForkpointError as err:
            st.error(md_escape(err, 400))
        bar.empty()


def matter_strip(trace: Trace) -> None:
    """A row of markers, one per takeover: does the answer hold with that takeover switched off?"""
    table = (st.session_state.get("sw_matter_tables") or {}).get(trace.key)
    if table is None or table.empty:
        return
    chips = []
    for row in table.itertuples():
        holds = row.same_answer
        colour = "#dcfce7" if holds else "#fee2e2"
        word = "answer holds" if holds else "answer changes"
        tip = f"#{row.pos} off: {word} ({row.answer!r}{'' if row.correct is None else ', ✓' if row.correct else ', ✗'})"
        chips.append(f"<span title='{html.escape(tip, quote=True)}' style='background:{colour};border-radius:4px;"
                     f"padding:1px 6px;margin-right:4px;font:12px system-ui'>#{row.pos} {'✓' if holds else '✗'}</span>")
    st.html("<div>Takeovers switched off one by one: " + "".join(chips) + "</div>")


def _runs(current: dict[int, int | str], typed: dict[int, int]) -> list[list[int]]:
    """The switches in force as rows: a typed run (`typed`, core.record.typed: text the user typed, one token
    or many) is one row, every other switch a row of its own."""
    rows: list[list[int]] = []
    for p in sorted(current):
        if rows and rows[-1][0] in typed and p < rows[-1][0] + typed[rows[-1][0]]:
            rows[-1].append(p)
        else:
            rows.append([p])
    return rows


def switch_list(trace: Trace) -> None:
    """The switches in force, each with its own toggle and an "undo all after this" (typed text: one row)."""
    current = switches_in_force(trace)
    if not current:
        return
    typed = typed_runs(trace)
    rows = _runs(current, typed)
    with st.container(border=True):
        st.markdown(f"**Switches** ({len(rows)}) · then {THEN_LABELS.get(st.session_state.get('sw_then', 'policy'))}")
        for run in rows:
            p, what = run[0], current[run[0]]
            text = "".join(trace.tokens[q] for q in run if q < len(trace))
            if p in typed:
                label = f"✎ #{p} {text!r}"
            else:
                label = f"⇄ #{p} → {'reasoner' if what == 'reason' else 'base' if what == 'base' else repr(text) if p < len(trace) else what}"
            row = st.container(horizontal=True, wrap=True, vertical_alignment="center")  # wraps, never cuts
            row.toggle(label, value=True, key=f"sw_{trace.key}_{p}", on_change=_queue_switches,
                       args=({q: w for q, w in current.items() if q not in run},), width="content")
            row.button("undo all after", key=f"sw_undo_{trace.key}_{p}", on_click=_queue_switches,
                       args=({q: w for q, w in current.items() if q <= run[-1]},), disabled=run[-1] == max(current),
                       width="content")
        st.button("Undo every switch", key=f"sw_none_{trace.key}", on_click=_queue_switches, args=({},))
