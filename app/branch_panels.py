"""The Trace page's branch views: several traces of one tree side by side (aligned at the shared prefix, one
colour scale, differing tokens marked, outcome on top, one scroll) and the branch tree as a graph (click a
node to open it). Display only: core.views.branch_graph lays the tree out, core.views.heatmap draws tokens."""

from __future__ import annotations

import difflib
import html
from functools import partial

import streamlit as st

from app import resources, state
from app.context import Context
from app.figures import branch_graph_figure
from app.switchboard import FRAGMENTS
from app.view import md_code
from core.errors import ForkpointError
from core.scoring.registry import score_label
from core.trace import Trace
from core.views.branch_graph import FOLD_ABOVE, graph_layout
from core.views.heatmap import heatmap_css, legend_html, tokens_html
from core.views.presentation import (
    branch_token_text,
    first_difference,
    sibling_labels,
    tail,
    token_diff,
    tree_rows,
)

MAX_COLUMNS = 4  # the open trace and up to three others
COLS_KEY = "cmp_cols"  # {"parent": open key, "keys": [trace keys]}: traces picked to sit beside the open one
PICKED_KEY = "cmp_picked"  # set by the multiselect's on_change: the page reruns to draw the new columns
MIN_COLUMN_PX = 220  # a narrower column wraps every other word: more columns than fit scroll sideways instead
COMPARE_CSS = """
.fp-cmp-grid { display: grid; gap: 0 10px; max-height: 460px; overflow: auto; border: 1px solid #e5e7eb;
  border-radius: 6px; padding: 0 8px 6px; }
.fp-cmp-head { position: sticky; top: 0; z-index: 2; background: #fff; border-bottom: 1px solid #e5e7eb;
  font: 12px/1.4 system-ui, sans-serif; padding: 6px 0 4px; overflow-wrap: anywhere; }
.fp-cmp-head b { font-size: 13px; }
.fp-cmp-head .ok { color: #15803d; } .fp-cmp-head .bad { color: #b91c1c; } .fp-cmp-head .na { color: #6b7280; }
.fp-compare { min-width: 0; padding-top: 4px; }
.fp-compare .fp-heatmap .tok.sel { box-shadow: 0 0 0 3px #f59e0b; }
"""


def branch_point(parent: Trace, child: Trace) -> int:
    """Where `child` leaves `parent`: its recorded branch position, else its first switch, else where the
    tokens first differ."""
    if child.meta.get("branch_pos") is not None:
        return int(child.meta["branch_pos"])
    switches = [int(p) for p in (child.meta.get("switches") or {})]
    if switches:
        return min(switches)
    diff = first_difference(parent, child, 0)
    return len(parent) if diff is None else diff


def _tree_keys(ctx: Context, trace: Trace) -> list[str]:
    try:
        return [node["key"] for _, node in tree_rows(ctx.store.tree(trace.key))]
    except ForkpointError:
        return [trace.key]


def compared(ctx: Context, trace: Trace) -> list[Trace]:
    """The traces shown beside the open one: the last branch (`ss["compare"]`, only when it really is a branch
    of the open trace: a URL is not trusted) and those picked from its tree, at most MAX_COLUMNS - 1."""
    ss = st.session_state
    s = ctx.settings
    out: list[Trace] = []
    job = ss.get("compare")
    if job and job.get("parent") == trace.key:
        try:
            child = resources.view_trace(s.store_path, str(job["child"]), s.score, s.rule.key(), s.rule)
        except ForkpointError:
            child = None
        # a real branch of the open trace, or the open trace itself (a takeover where the reasoner already wrote)
        if child is None or (child.meta.get("parent") != trace.key and child.key != trace.key):
            st.warning(f"{md_code(str(job['child'])[:16])} is not a branch of the open trace, so there is nothing to "
                       "compare it with here; the comparison was closed.")
            ss["compare"] = None
        else:
            real = branch_point(trace, child)
            if job.get("pos") != real:  # a hand-edited `compare=key@999999` names the wrong token
                ss["compare"] = {**job, "pos": real}
            out.append(child)
    picked = ss.get(COLS_KEY) or {}
    if picked.get("parent") == trace.key:
        tree = set(_tree_keys(ctx, trace))
        for key in picked.get("keys") or []:
            if key in tree and key != trace.key and key not in {t.key for t in out}:
                try:
                    out.append(resources.view_trace(s.store_path, key, s.score, s.rule.key(), s.rule))
                except ForkpointError:
                    continue
    return out[: MAX_COLUMNS - 1]


def _verdict(trace: Trace) -> str:
    correct, answer = trace.meta.get("correct"), trace.meta.get("answer")
    cls, word = ("ok", "✓ correct") if correct is True else ("bad", "✗ wrong") if correct is False else ("na", "– ungraded")
    shown = "(none)" if answer is None else str(answer)
    return f"<span class='{cls}'>{word}</span> · answer <code>{html.escape(shown[:60])}</code>"


def _differing(first: Trace, other: Trace, start: int) -> list[int]:
    """Positions of `other` (from `start` on) not in an equal run when aligned with `first` token by token."""
    a, b = first.token_ids[start:].tolist(), other.token_ids[start:].tolist()
    out: list[int] = []
    for op, _i1, _i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op != "equal":
            out += range(start + j1, start + j2)
    return out


def columns_html(traces: list[Trace], titles: list[str], start: int, score: str, scale: str, lo, hi,
                 reference, decode_note: str = "") -> str:
    """The traces from token `start` on as grid columns under one scroll: a sticky head (title, length,
    outcome, answer) per column; tokens that differ from the first column underlined; each column's first
    difference from the first ringed."""
    heads, bodies = [], []
    first = traces[0]
    for i, (t, title) in enumerate(zip(traces, titles)):
        diff = None if i == 0 else first_difference(first, t, start)
        part = tail(t, start)
        marked = [p - start for p in _differing(first, t, start)] if i else []
        body = tokens_html(part, score=score, scale=scale, vmin=lo, vmax=hi, reference=reference, offset=start,
                           selected=None if diff is None else diff - start, tips=False, css_tips=False, marked=marked)
        side = "original" if i == 0 else "branch" if i == 1 else f"branch-{i}"
        heads.append(f"<div class='fp-cmp-head'><b>{html.escape(title)}</b> · {len(t)} tokens<br>{_verdict(t)}"
                     + (f"<br><span class='na'>{len(marked)} tokens differ from the first column</span>" if i else "")
                     + "</div>")
        bodies.append(f'<div class="fp-compare" data-side="{side}" data-key="{html.escape(str(t.key))}">{body}</div>')
    n = len(traces)
    return (f"<style>{heatmap_css()}{COMPARE_CSS}</style>"
            f"<div class='fp-cmp-grid' style='grid-template-columns: repeat({n}, minmax({MIN_COLUMN_PX}px, 1fr))'>"
            + "".join(heads) + "".join(bodies) + "</div>")


def compare_panel(ctx: Context, trace: Trace, lo: float | None, hi: float | None, reference=None) -> None:
    """The open trace and the compared ones side by side, from the shared prefix on, on the main view's range."""
    others = compared(ctx, trace)
    if not others:
        return
    s = ctx.settings
    start = min(branch_point(trace, t) if t.meta.get("parent") == trace.key else
                (first_difference(trace, t, 0) or 0) for t in others)
    start = max(0, min(start, len(trace)))
    job = st.session_state.get("compare") or {}
    child = others[0]
    if len(others) == 1 and job.get("child") == child.key:
        what = branch_token_text(child, resources.decoder(ctx.pair, child))
        st.markdown(f"#### Branch at token #{job['pos']}" + (f" · {md_code(what)}" if what else ""))
        diff = first_difference(trace, child, start)
        st.caption(f"Shared prefix: {start} tokens. " + ("The continuations are identical." if diff is None else
                   f"First difference at #{diff} (ringed); tokens that differ are underlined."))
    else:
        st.markdown(f"#### {len(others) + 1} traces side by side from token #{start}")
        st.caption(f"Shared prefix: {start} tokens. Tokens that differ from the first column are underlined; each "
                   "column's first difference is ringed.")
    titles = ["Open trace"] + [_title(ctx, trace, t) for t in others]
    st.html(f"<style>{heatmap_css()}</style>" + legend_html(
        [tag for t in [trace, *others] for tag in (t.annotations.get("tags") or [])], score=s.score, vmin=lo, vmax=hi,
        scale=s.scale, spike_rule=s.rule.describe(), range_note="one range for every column"))
    st.html(columns_html([trace, *others], titles, start, s.score, s.scale, lo, hi, reference))
    with st.expander("Shared prefix", expanded=False):
        st.text("".join(trace.tokens[:start]))
    with st.expander("Token-aligned diff with score deltas (open trace vs the next column)", expanded=False):
        table = token_diff(trace, child, start, s.score)
        st.caption(f"Aligned on equal tokens (difflib); delta = branch − original {score_label(s.score)}.")
        st.dataframe(table, hide_index=True, width="stretch", key="diff_table",
                     column_config={c: st.column_config.NumberColumn(format="%.4f")
                                    for c in ("score_original", "score_branch", "delta")})
    row = st.container(horizontal=True, wrap=True)  # buttons as wide as their labels, however many columns
    if job.get("child") == child.key and row.button("Open the branch", key="open_branch", width="content"):
        state.open_trace(child.key, (child.meta.get("problem") or {}).get("id"), branch_point(trace, child))
        st.rerun()
    if row.button("Close the comparison", key="close_compare", width="content"):
        st.session_state["compare"] = None
        st.session_state[COLS_KEY] = None
        st.rerun()


def _title(ctx: Context, trace: Trace, other: Trace) -> str:
    what = branch_token_text(other, resources.decoder(ctx.pair, other)) if other.meta.get("parent") else ""
    rel = "branch" if other.meta.get("parent") == trace.key else "trace"
    return f"{rel} {str(other.key)[:8]}" + (f" · {what}" if what else "")


def edge_label(ctx: Context, key: str) -> str:
    """What a node changed against its parent ("⇄ #12 reasoner ' Wait'"), read from the stored child."""
    try:
        child = resources.load_trace(ctx.settings.store_path, key)
    except ForkpointError:
        return ""
    return _edge_label(ctx, child)


def _edge_label(ctx: Context, child: Trace) -> str:
    if not child.meta.get("parent"):
        return ""
    return branch_token_text(child, resources.decoder(ctx.pair, child)) or f"branch @ {child.meta.get('branch_pos')}"


def edge_labels(ctx: Context, keys: list[str]) -> dict[str, str]:
    """`edge_label` of each stored trace of `keys`, siblings that read alike told apart (`sibling_labels`: a
    fan's samples)."""
    children = []
    for key in keys:
        try:
            children.append(resources.load_trace(ctx.settings.store_path, key))
        except ForkpointError:
            continue
    labels = {key: "" for key in keys} | {child.key: _edge_label(ctx, child) for child in children}
    return sibling_labels(labels, children)


def graph_panel(ctx: Context, trace: Trace) -> None:
    """The branch tree holding this trace as a graph: click a node to open it; pick traces to set side by side."""
    try:
        tree = ctx.store.tree(trace.key)
    except ForkpointError:
        return
    rows = tree_rows(tree)
    if len(rows) < 2:
        return
    ss = st.session_state
    with st.expander(f"Branch tree ({len(rows)} traces)", expanded=True):
        c1, c2 = st.columns([3, 2], vertical_alignment="bottom")
        fold = c2.toggle("Fold other subtrees", value=len(rows) > FOLD_ABOVE,
                         key=f"tree_fold_{trace.key}", help="Fold the subtrees away from the open trace: a folded one is "
                                                             "a square with the number of traces under it; click it to "
                                                             "open it and unfold its path.")
        nodes = graph_layout(tree, trace.key, fold=fold)
        labels = edge_labels(ctx, [n.key for n in nodes])
        keys = [node["key"] for _, node in rows if node["key"] != trace.key]
        pick_key = f"cmp_pick_{trace.key}"
        picked = ss.get(COLS_KEY) or {}
        shown = [k for k in picked.get("keys") or [] if k in keys] if picked.get("parent") == trace.key else []
        # COLS_KEY is the one record of the columns; the widget mirrors it. Set elsewhere (a fan, Close the
        # comparison), it must reach a widget drawn before: a widget's `default` counts only on its first draw
        if ss.get(pick_key) != shown:
            ss[pick_key] = shown
        c1.multiselect("Side by side with the open trace (up to 3)", keys, max_selections=MAX_COLUMNS - 1,
                       format_func=lambda k: f"{k[:8]} · {labels.get(k) or edge_label(ctx, k) or 'root'}",
                       key=pick_key, on_change=_on_pick, args=(trace.key, pick_key))
        if ss.pop(PICKED_KEY, False):  # the user's pick: the token view (another fragment) draws the columns
            st.rerun()
        st.caption("Node colour: green correct, red wrong, grey ungraded · the number in a node: its takeovers · "
                   "the ringed node is open · click a node to open it.")
        # one chart per tree and folding: a switch updates it in place; a fresh one after a node is opened
        graph_key = f"tree_graph_{rows[0][1]['key']}_{fold}_{ss.get('tree_nonce', 0)}"
        st.plotly_chart(branch_graph_figure(nodes, labels, trace.key), key=graph_key,
                        on_select=partial(_on_node, graph_key, trace), selection_mode="points",
                        config={"displayModeBar": False})


def _on_pick(parent: str, pick_key: str) -> None:
    """The user changed the side-by-side multiselect: its value becomes the columns (COLS_KEY)."""
    ss = st.session_state
    ss[COLS_KEY] = {"parent": parent, "keys": list(ss.get(pick_key) or [])}
    ss[PICKED_KEY] = True


def _on_node(graph_key: str, trace: Trace) -> None:
    """A click on a node of the branch graph opens that trace (the whole trace view follows)."""
    ss = st.session_state
    event = ss.get(graph_key)
    for point in (event or {}).get("selection", {}).get("points", []) if event else []:
        key = point.get("customdata")
        if isinstance(key, list):
            key = key[0] if key else None
        if isinstance(key, str) and key != trace.key:
            ss["tree_nonce"] = int(ss.get("tree_nonce", 0)) + 1  # the old chart's selection must not fire again
            state.open_trace(key, (trace.meta.get("problem") or {}).get("id"))
            st.rerun(list(FRAGMENTS))
