"""The Trace page's selection panel: the selected token's numbers, both models' top-k, and the branch actions
(take over, force a top-k, vocabulary or typed token, n alternatives), each queued for `app/branch_runner.py`."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import actions, resources
from app.context import Context
from app.view import md_code
from core.scoring.registry import metric_label, score_label, score_values
from core.trace import SIDES, Trace
from core.views.heatmap import grapheme_start
from core.views.presentation import both_probs, fmt_num, fmt_prob, prob_at, takeover_choices, who_wrote

VOCAB_MATCHES = 50  # most vocabulary matches offered by the force-a-token search
BRANCH_TOOLS = "branch_tools"  # session key of the "Branch from here" toggle (flip and edit mode)


def _topk_table(trace: Trace, sel: int, side: str, decode, mode: str) -> pd.DataFrame:
    """One model's top-k at `sel` with its own p and the other model's p (blank: outside its top-k)."""
    other = "reason" if side == "base" else "base"
    ids, probs = trace.topk[side]
    head = "log p" if mode == "logprob" else "p"
    return pd.DataFrame({
        f"{side} top-{len(ids[sel])}": [repr(decode(int(i))) if decode else f"#{int(i)}" for i in ids[sel]],
        f"{head} {side}": [fmt_prob(float(p), mode) for p in probs[sel]],
        f"{head} {other}": [fmt_prob(prob_at(trace, other, sel, int(i)), mode) if prob_at(trace, other, sel, int(i))
                            is not None else "" for i in ids[sel]],
    })


def selection_panel(ctx: Context, trace: Trace, sel: int | None) -> None:
    """The selected token's numbers, both top-k lists, and the takeover actions."""
    if sel is None:
        mode = st.session_state.get("click_mode", "flip") if ctx.pair is not None else "select"
        st.info({"flip": "Click a token to flip the reasoning model's takeover there: the response re-flows from it. "
                         "Press **n** / **p** for the next / previous token where a flip changes the text, or choose "
                         "*selects it* above to inspect a token and branch from it.",
                 "edit": "Click a token (or move with ← → and press Enter), type your text, Enter: the base model "
                         "continues from it and the new trace opens. **n** / **p**: the next / previous token where "
                         "the reasoner would write something else; Escape cancels.",
                 }.get(mode, "Click a token (or press **n** / **p** for the next / previous spike) to select it, "
                             "then let the reasoning model take over there."))
        return
    decode = resources.decoder(ctx.pair, trace)
    mode = ctx.settings.prob_mode
    m = trace.metrics
    st.markdown(f"**Token #{sel}** · {who_wrote(trace, sel)}")
    st.markdown(md_code(repr(trace.tokens[sel]), 200))  # not st.code: its highlighter took a third of a redraw
    first = grapheme_start(trace.tokens, sel)
    if first != sel:
        st.warning(f"Token #{sel} is a byte piece of a character that starts at token #{first}: a takeover here keeps "
                   "the earlier piece(s), so the branch starts mid-character (drawn as �).")
        st.button(f"Select #{first}, the character's first token", key="sel_grapheme_start",
                  on_click=lambda: st.session_state.update(sel_pos=first))
    # a table, not st.metric boxes (the narrow column cut values such as 1.08e-05 to "1.08…"), one metric a row
    # (three columns of long names ran out of an 800 px window)
    shown = {score_label(ctx.settings.score): score_values(m, ctx.settings.score)[sel],
             metric_label("entropy_base"): m["entropy_base"][sel],
             metric_label("kl_base_reason"): m["kl_base_reason"][sel]}
    st.markdown("| metric | value |\n|---|---|\n" + "".join(f"| {name} | **{fmt_num(v)}** |\n" for name, v in shown.items()))
    for side in SIDES:  # stacked: the right column is too narrow for two tables of three columns
        st.dataframe(_topk_table(trace, sel, side, decode, mode), hide_index=True, width="stretch",
                     height=min(400, 35 * (trace.k + 1) + 3))
    # the branch tools are many widgets: in flip and edit mode (a click switches) they are drawn only when asked
    # for, so a switch's page update does not redraw them (benchmarks/RESULTS.md, "Switchboard")
    if st.session_state.get("click_mode", "flip") in ("flip", "edit") and not st.toggle(
            "Branch from here", key=BRANCH_TOOLS,
            help="Take over, force a top-k, vocabulary or typed token, or sample n alternatives from this token."):
        return
    disabled = ctx.pair is None
    limit_default = int((trace.meta.get("sampling") or {}).get("max_new_tokens") or max(len(trace) + 64, 64))
    max_new = st.number_input("Max tokens of the branch (prefix included)", min_value=sel + 1,
                              value=max(limit_default, sel + 1), step=16, key=f"branch_limit_{sel}")
    sampling = _branch_sampling(trace)
    if st.button("Reasoning model takes over here", type="primary", disabled=disabled, key="takeover_reason",
                 width="stretch"):
        _queue_branch(trace, sel, None, int(max_new), sampling)
    choices = takeover_choices(trace, sel, decode, mode)
    emitted = int(trace.token_ids[sel])  # offered first: the best-ranked token that would change the text
    first_other = next((i for i in range(1, len(choices)) if choices[i].token != emitted), 1)
    pick = st.selectbox("… or force a top-k token", range(1, len(choices)), help="Either model's top-k at this token.",
                        index=max(0, first_other - 1), format_func=lambda i: choices[i].label,
                        key=f"takeover_pick_{trace.key}_{sel}")
    if st.button("Branch with this token", disabled=disabled or pick is None, key="takeover_token",
                 width="stretch"):
        _queue_branch(trace, sel, choices[pick].token, int(max_new), sampling)
    if not disabled:
        _fan_controls(trace, sel)
        _force_any(ctx, trace, sel, int(max_new), sampling)
    else:
        st.caption("Load a model pair (sidebar) to branch.")


def _fan_controls(trace: Trace, sel: int) -> None:
    """"n alternatives from here": sampled continuations from the selected token, side by side and as siblings
    in the branch graph."""
    parent_t = float((trace.meta.get("sampling") or {}).get("temperature") or 0.0)
    row = st.container(horizontal=True, wrap=True, vertical_alignment="bottom")
    n = row.number_input("Alternatives", 1, actions.FAN_MAX, actions.FAN_MAX, key="fan_n", width=120)
    t = row.number_input("at temperature", 0.05, 2.0, parent_t if parent_t > 0 else 0.8, 0.05, key="fan_t", width=140)
    if row.button(f"{int(n)} alternatives from here", key="fan_go",
                  help="The reasoner writes this token, then the rest is sampled; each one is stored and shown "
                       "beside the open trace."):
        st.session_state["pending"] = {"kind": "fan", "parent": trace.key, "pos": int(sel), "n": int(n),
                                       "temperature": float(t), "then": st.session_state.get("sw_then", "policy")}
        st.rerun()


def _branch_sampling(trace: Trace) -> dict:
    """Per-branch temperature and seed (default: the parent's)."""
    parent = trace.meta.get("sampling") or {}
    with st.expander("Branch sampling (temperature, seed)", expanded=False):
        c1, c2 = st.columns(2)
        temperature = c1.number_input("temperature", 0.0, 2.0, float(parent.get("temperature", 0.0)), 0.1,
                                      key="branch_temperature", help="0 = greedy; the parent's by default.")
        seed = c2.number_input("seed", 0, 2**31 - 1, int(parent.get("seed", 0)), key="branch_seed")
    out = {}
    if float(temperature) != float(parent.get("temperature", 0.0)):
        out["temperature"] = float(temperature)
    if int(seed) != int(parent.get("seed", 0)):
        out["seed"] = int(seed)
    return out


def _force_any(ctx: Context, trace: Trace, sel: int, max_new: int, sampling: dict) -> None:
    """Force any vocabulary token (search by text) or a typed string (its tokens, in order)."""
    pair = ctx.pair
    with st.expander("Force any token or a typed string", expanded=False):
        query = st.text_input("Search the vocabulary", key="vocab_query", placeholder="e.g. subtract")
        if query:
            matches = resources.vocab_search(pair, query, VOCAB_MATCHES)
            if not matches:
                st.caption(f"No token contains {md_code(query)}.")
            else:
                tok = st.selectbox(f"{len(matches)} matching token{'s' if len(matches) != 1 else ''}", [i for i, _ in matches], key="vocab_pick",
                                   format_func=lambda i: f"{dict(matches)[i]!r} (id {i}) · "
                                                         f"{both_probs(trace, sel, i, ctx.settings.prob_mode)}")
                if st.button("Branch with this vocabulary token", key="takeover_vocab", width="stretch"):
                    _queue_branch(trace, sel, int(tok), max_new, sampling)
        typed = st.text_input("… or type a string to force (tokenised by the pair)", key="typed_force")
        if typed:
            ids = pair.encode(typed)
            st.caption(f"{len(ids)} token(s): " + " ".join(md_code(pair.token_text(i), 24) for i in ids[:12]))
            if ids and st.button("Branch with this string", key="takeover_typed", width="stretch"):
                _queue_branch(trace, sel, int(ids[0]), max(max_new, sel + len(ids)), sampling, rest=ids[1:])


def _queue_branch(trace: Trace, pos: int, token: int | None, max_new_tokens: int, sampling: dict | None = None,
                  rest: list[int] | None = None) -> None:
    st.session_state["pending"] = {"kind": "branch", "parent": trace.key, "pos": int(pos), "token": token,
                                   "max_new_tokens": max_new_tokens, "sampling": dict(sampling or {}),
                                   "rest": [int(i) for i in rest or []]}
    st.rerun()  # a full run: the branch is generated outside the fragment, where Cancel can interrupt it
