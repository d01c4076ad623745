"""The Trace page's parts: header, token panel (a fragment), selection and takeover panel, branch
comparison, branch tree, and the queued-branch runner with progress and cancel."""

from __future__ import annotations

import html

import pandas as pd
import streamlit as st

from app import actions, resources, state
from app.components.token_view import token_view
from app.context import Context, get_context
from app.figures import trace_figure
from app.view import first_difference, md_code, spike_list, tail, takeover_choices, tree_label, tree_rows
from core.metrics import score_values
from core.errors import ForkpointError
from core.heatmap import heatmap_css, tokens_html
from core.trace import Trace

VIEW_KEY = "tokview"
COMPARE_CSS = """
.fp-compare-head { font: 600 13px system-ui, sans-serif; margin: 0 0 4px; }
.fp-compare .fp-heatmap .tok.sel { box-shadow: 0 0 0 3px #f59e0b; }
.fp-compare { max-height: 420px; overflow-y: auto; border: 1px solid #e5e7eb; border-radius: 6px; padding: 6px 8px; }
"""


def _grade_text(trace: Trace) -> str:
    correct = trace.meta.get("correct")
    answer = trace.meta.get("answer")
    verdict = "✓ correct" if correct is True else "✗ wrong" if correct is False else "– ungraded"
    return f"{verdict} · answer: {md_code(answer) if answer is not None else '(none)'}"


def header(trace: Trace, rule_text: str) -> None:
    """Problem text, the trace's vital numbers and the legend."""
    problem = trace.meta.get("problem") or {}
    st.markdown(f"#### Problem {md_code(problem.get('id') or '(ad hoc)')}")
    st.text(problem.get("prompt") or "")
    policy = (trace.meta.get("policy") or {}).get("name") or trace.meta.get("kind") or "?"
    takeovers = int(sum(1 for s in trace.source if s != "base"))
    cols = st.columns(5)
    cols[0].metric("Tokens", len(trace))
    cols[1].metric("Policy", policy)
    cols[2].metric("Takeovers", takeovers)
    cols[3].metric(f"Spikes ({rule_text})", len(spike_list(trace)))
    cols[4].metric("Gold", str(problem.get("gold")) if problem.get("gold") is not None else "–")
    st.caption(_grade_text(trace) + (f" · branched at #{trace.meta['branch_pos']} from {md_code(str(trace.meta.get('parent'))[:8])}"
                                     if trace.meta.get("branch_pos") is not None else ""))


def _on_click() -> None:
    event = st.session_state[VIEW_KEY].click
    if isinstance(event, dict) and event.get("pos") is not None:
        st.session_state["sel_pos"] = int(event["pos"])


def _plot_key(trace: Trace, score: str) -> str:
    return f"plot-{trace.key}-{score}"


def _on_plot(plot_key: str) -> None:
    event = st.session_state.get(plot_key)
    points = (event or {}).get("selection", {}).get("points", []) if event else []
    for point in points:
        pos = point.get("customdata", point.get("x"))
        if isinstance(pos, list):
            pos = pos[0] if pos else None
        if pos is not None:
            st.session_state["sel_pos"] = int(pos)
            return


@st.fragment
def trace_panel(key: str) -> None:
    """Token view, score plot and selection panel; a click reruns only this fragment."""
    ss = st.session_state
    if ss.get("trace_key") != key:  # another trace was opened from inside the fragment
        st.rerun()
    ctx = get_context()
    s = ctx.settings
    try:
        trace = resources.view_trace(s.store_path, key, s.score, s.rule.key(), s.rule)
        data = resources.render_data(s.store_path, key, s.score, s.scale, s.rule.key(), _pair_tag(ctx), s.rule, ctx.pair)
    except ForkpointError as err:
        st.error(str(err))
        return
    sel = ss.get("sel_pos")
    if sel is not None and not 0 <= sel < len(trace):
        sel = ss["sel_pos"] = None
    st.html(f"<style>{heatmap_css()}</style>{data['legend']}")
    left, right = st.columns([3, 2], gap="medium")
    with left:
        token_view(data, selected=sel, key=VIEW_KEY, on_click=_on_click)
        plot_key = _plot_key(trace, s.score)
        st.plotly_chart(trace_figure(trace, s.score), key=plot_key, on_select=lambda: _on_plot(plot_key),
                        selection_mode="points", config={"displayModeBar": False})
    with right:
        selection_panel(ctx, trace, sel)
    compare_panel(ctx, trace)
    tree_panel(ctx, trace)
    state.write_query_params()


def _pair_tag(ctx: Context) -> str:
    return "none" if ctx.pair is None else repr(ctx.pair.fingerprint())


def selection_panel(ctx: Context, trace: Trace, sel: int | None) -> None:
    """The selected token's numbers, both top-k lists, and the takeover actions."""
    if sel is None:
        st.info("Click a token (or press **n** / **p** for the next / previous spike) to select it, "
                "then let the reasoning model take over there.")
        return
    decode = resources.decoder(ctx.pair, trace)
    m = trace.metrics
    st.markdown(f"**Token #{sel}** · emitted by **{trace.source[sel]}**")
    st.code(repr(trace.tokens[sel]), language=None)
    c = st.columns(3)
    c[0].metric("score", f"{float(score_values(trace.metrics, ctx.settings.score)[sel]):.3f}")
    c[1].metric("H base", f"{float(m['entropy_base'][sel]):.3f}")
    c[2].metric("KL(b‖r)", f"{float(m['kl_base_reason'][sel]):.3f}")
    tops = st.columns(2)
    for col, side in zip(tops, ("base", "reason")):
        ids, probs = trace.topk[side]
        col.dataframe(pd.DataFrame({
            f"{side} top-k": [repr(decode(int(i))) if decode else f"#{int(i)}" for i in ids[sel]],
            "p": [round(float(p), 4) for p in probs[sel]],
        }), hide_index=True, width="stretch")
    disabled = ctx.pair is None
    limit_default = int((trace.meta.get("sampling") or {}).get("max_new_tokens") or max(len(trace) + 64, 64))
    max_new = st.number_input("Max tokens of the branch (prefix included)", min_value=sel + 1,
                              value=max(limit_default, sel + 1), step=16, key=f"branch_limit_{sel}")
    if st.button("Reasoning model takes over here", type="primary", disabled=disabled, key="takeover_reason",
                 width="stretch"):
        _queue_branch(trace, sel, None, int(max_new))
    choices = takeover_choices(trace, sel, decode)
    pick = st.selectbox("… or force a token from either model's top-k", range(1, len(choices)),
                        format_func=lambda i: choices[i].label, key=f"takeover_pick_{trace.key}_{sel}")
    if st.button("Branch with this token", disabled=disabled or pick is None, key="takeover_token",
                 width="stretch"):
        _queue_branch(trace, sel, choices[pick].token, int(max_new))
    if disabled:
        st.caption("Load a model pair (sidebar) to branch.")


def _queue_branch(trace: Trace, pos: int, token: int | None, max_new_tokens: int) -> None:
    st.session_state["pending"] = {"kind": "branch", "parent": trace.key, "pos": int(pos), "token": token,
                                   "max_new_tokens": max_new_tokens}
    st.rerun()  # a full run: the branch is generated outside the fragment, where Cancel can interrupt it


def run_pending(ctx: Context) -> None:
    """Run a queued branch with a progress bar; the Cancel button interrupts it (nothing is stored)."""
    ss = st.session_state
    job = ss.get("pending")
    if not job:
        return
    slot = st.empty()
    box = slot.container(border=True)
    where = f"token #{job['pos']}" + ("" if job["token"] is None else f" with token id {job['token']}")
    box.markdown(f"**Generating a branch at {where}** …")
    if box.button("Cancel", key="cancel_pending"):
        ss["pending"] = None
        state.notice("info", "Branch cancelled; nothing was stored.")
        st.rerun()
    if ctx.pair is None:
        ss["pending"] = None
        box.error("No model pair is loaded; load one in the sidebar to branch.")
        return
    bar = box.progress(0.0, text="starting")

    def progress(done: int, total: int) -> None:
        bar.progress(min(1.0, done / max(total, 1)), text=f"{done} / {total} tokens")

    s = ctx.settings
    try:
        parent = resources.load_trace(s.store_path, job["parent"])
        child = actions.run_branch(ctx.pair, ctx.store, parent, job["pos"], job["token"], job["max_new_tokens"],
                                   progress=progress)
    except ForkpointError as err:
        ss["pending"] = None
        box.error(f"Could not branch: {err}")
        return
    ss["pending"] = None
    ss["compare"] = {"parent": parent.key, "child": child.key, "pos": job["pos"]}
    ss["sel_pos"] = job["pos"]
    slot.empty()
    state.notice("success", f"Branch stored ({len(child)} tokens, {_grade_text(child)}).")


def _html_block(trace: Trace, side: str, start: int, diff: int | None) -> str:
    part = tail(trace, start)
    body = tokens_html(part, selected=None if diff is None else diff - start, tips=False, css_tips=False)
    return (f'<div class="fp-compare" data-side="{html.escape(side)}" data-key="{html.escape(str(trace.key))}">'
            f"{body}</div>")


def compare_panel(ctx: Context, trace: Trace) -> None:
    """The last branch of this trace beside the original, from the branch point, first difference ringed."""
    job = st.session_state.get("compare")
    if not job or job.get("parent") != trace.key:
        return
    s = ctx.settings
    try:
        child = resources.view_trace(s.store_path, job["child"], s.score, s.rule.key(), s.rule)
    except ForkpointError as err:
        st.error(str(err))
        return
    pos = int(job["pos"])
    diff = first_difference(trace, child, pos)
    st.markdown(f"#### Branch at token #{pos}")
    st.caption(f"Shared prefix: {pos} tokens. " + ("The continuations are identical." if diff is None else
               f"First difference at #{diff} (ringed)."))
    with st.expander("Shared prefix", expanded=False):
        st.text("".join(trace.tokens[:pos]))
    cols = st.columns(2)
    for col, t, side in ((cols[0], trace, "original"), (cols[1], child, "branch")):
        with col:
            st.markdown(f"**{side.capitalize()}** · {len(t)} tokens · {_grade_text(t)}")
            st.html(f"<style>{heatmap_css()}{COMPARE_CSS}</style>{_html_block(t, side, pos, diff)}")
    if st.button("Open the branch", key="open_branch"):
        state.open_trace(child.key, (child.meta.get("problem") or {}).get("id"), pos)
        st.rerun()


def tree_panel(ctx: Context, trace: Trace) -> None:
    """The branch tree holding this trace; choosing a node opens it."""
    try:
        tree = ctx.store.tree(trace.key)
    except ForkpointError:
        return
    rows = tree_rows(tree)
    if len(rows) < 2:
        return
    keys = [node["key"] for _, node in rows]
    labels = {node["key"]: tree_label(depth, node) for depth, node in rows}
    with st.expander(f"Branch tree ({len(rows)} traces)", expanded=True):
        chosen = st.radio("Open", keys, index=keys.index(trace.key) if trace.key in keys else 0,
                          format_func=lambda k: labels[k] + ("  ← open" if k == trace.key else ""),
                          key=f"tree_{trace.key}", label_visibility="collapsed")
    if chosen != trace.key:
        state.open_trace(chosen, (trace.meta.get("problem") or {}).get("id"))
        st.rerun()
