"""Compare: one response scored against several reasoners that share the base (core.compare), shown as
stacked heatmap rows aligned by token, with each reasoner's top-k at a chosen token."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import resources, state
from app.compare_panels import stacked_rows_html
from app.context import get_context
from app.view import md_code, md_escape
from core.annotate import rank_shift as rs
from core.errors import ForkpointError
from core.analysis.comparison import compare, reasoner_name, with_reasoner
from core.scoring.registry import score_label

SELF = "the base model itself (a reference: its KL and JSD against the base are 0)"
# cross-entropy is H(base) + KL, so the base against itself scores its own entropy, not 0: say so where it shows
NOT_ZERO = {"cross_entropy": "its cross-entropy against itself is the base entropy",
            "entropy_reason": "this score is the reasoner's entropy, here the base's own"}


@st.cache_resource(show_spinner=False, max_entries=4)
def _reasoner_pair(fingerprint: str, source: str, _pair) -> object:
    """The current pair's base with another reasoner (loaded once per process)."""
    if source == SELF:
        return with_reasoner(_pair, _pair.specs["base"].id, revision=_pair.specs["base"].revision,
                             reason_format=_pair.formats["base"].spec)
    return with_reasoner(_pair, source)


def _pairs(ctx, sources: list[str]) -> list:
    fp = repr(ctx.pair.fingerprint())
    return [ctx.pair] + [_reasoner_pair(fp, src, ctx.pair) for src in sources]


def _pick_response(ctx) -> tuple[dict, list[int]] | None:
    df = ctx.store.summaries()
    if df.empty:
        st.info("The store holds no traces: make one on the Trace or Generate page, then compare its response.")
        return None
    df = df.sort_values("created", ascending=False)
    labels = {str(k): f"{p if isinstance(p, str) else '—'} · {pol if isinstance(pol, str) else kind} · {n} tokens · "
                      f"{str(k)[:8]}"
              for k, p, pol, kind, n in zip(df["key"], df["problem"], df["policy"], df["kind"], df["n_tokens"])}
    keys = list(labels)
    open_key = st.session_state.get("trace_key")
    if st.session_state.get("cmp_key") not in keys:  # first visit, or the chosen trace is gone: the open trace
        st.session_state["cmp_key"] = open_key if open_key in keys else keys[0]
    key = st.selectbox("Response (a stored trace)", keys, format_func=labels.get, key="cmp_key")
    trace = resources.load_trace(ctx.settings.store_path, key)
    problem = trace.meta.get("problem") or {}  # its id travels to the scored traces (the Problems page lists it)
    return {"id": problem.get("id"), "prompt": str(problem.get("prompt") or ""), "gold": problem.get("gold")}, \
        [int(i) for i in trace.token_ids]


def main() -> None:
    ctx = get_context()
    state.show_notice()
    st.title("Compare reasoners")
    if ctx.pair is None:
        st.warning("No model pair is loaded (see the sidebar).")
        return
    st.caption(f"Score one response against this pair's reasoner ({reasoner_name(ctx.pair)}) and other reasoners "
               "that share its base model and vocabulary (e.g. a 1.7B and an 8B thinking model). The base runs once.")
    others = st.text_area("Other reasoners, one per line (hub id, local folder or .gguf file)", key="cmp_sources",
                          help="Each must share the base's vocabulary; its prompt format is its chat template when it "
                               "has one.")
    use_self = st.checkbox(f"Add {SELF}", value=not others.strip(), key="cmp_self")
    sources = [line.strip() for line in others.splitlines() if line.strip()] + ([SELF] if use_self else [])
    picked = _pick_response(ctx)
    if picked is None:
        return
    keep = st.checkbox("Store the scored traces (the Dataset page then compares the reasoners)", value=True,
                       key="cmp_store")
    if st.button("Compare", type="primary", disabled=not sources, key="cmp_go"):
        try:
            with st.spinner(f"Loading and scoring {len(sources) + 1} reasoners …"):
                pairs = _pairs(ctx, sources)
                names = [reasoner_name(p) for p in pairs]
                if SELF in sources:
                    names[-1] = f"{names[-1]} (base itself)"
                comp = compare(pairs, picked[0], picked[1], names=names, store=ctx.store if keep else None)
                st.session_state["cmp_result"] = (picked, comp)  # with the response it belongs to
        except ForkpointError as err:
            st.session_state["cmp_result"] = None  # never the previous result under a new error
            st.error(md_escape(err, 400))
    made_for, comp = st.session_state.get("cmp_result") or (None, None)
    if comp is None:
        return
    if made_for != picked:
        st.info("The last comparison was of another response: press Compare to score this one.")
        return
    if keep:
        st.caption(f"The {len(comp.traces)} scored traces are in the store (kind score, one per reasoner, problem "
                   f"{md_escape(made_for[0].get('id') or '—')}): the Dataset page compares the reasoners.")
    _show(ctx, comp)


def _show(ctx, comp) -> None:
    score = ctx.settings.score
    decode = resources.decoder(ctx.pair)
    c1, c2 = st.columns([2, 3])
    mode = c1.radio("Colour", ("score", rs.NAME), horizontal=True, key="cmp_mode",
                    format_func=lambda m: score_label(score) if m == "score" else "rank shift (categories)")
    pos = c2.number_input("Token", 0, max(len(comp) - 1, 0), 0, key="cmp_pos",
                          help="The token whose top-k table is shown below (ringed in every row).")
    st.html(stacked_rows_html(comp, score, decode, selected=int(pos), mode=mode))
    if any(n.endswith("(base itself)") for n in comp.names) and score in NOT_ZERO and mode == "score":
        st.caption(f"The base-itself row is tinted because {NOT_ZERO[score]}, not a disagreement; a divergence "
                   "(KL, JSD in the sidebar's score) is 0 on that row.")
    if not len(comp):
        st.info("This response has no tokens: nothing to compare.")
        return
    st.subheader(f"Top-k at token {int(pos)} {md_code(repr(comp.tokens[int(pos)]))}")
    st.dataframe(comp.topk_table(int(pos), decode), hide_index=True, width="stretch")
    summary = pd.DataFrame({"reasoner": comp.names,
                            f"mean {score_label(score)}": [float(comp.frame(score)[n].mean()) for n in comp.names],
                            "shifted ratio": [rs.shifted_ratio(t) for t in comp.traces]})
    st.dataframe(summary, hide_index=True, width="stretch")
    with st.expander("per-token table"):
        st.dataframe(comp.frame(score), hide_index=True, width="stretch")


main()
