"""The research instruments in the app (core/instruments/): on a trace, measured takeover effects (marked on
the token view itself: core.instruments.effects.attach_effects, drawn by core/views/heatmap.py), the
success curve and the logit lens of the selected token; on the Dataset page, token statistics, effect
against disagreement, and a per-trace histogram whose bars filter the Problems table. Two hooks: `trace_instruments`
(app/screens/trace.py) and `dataset_instruments` (app/screens/dataset.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app import resources, state
from app.context import Context
from app.filters import SUBSET_KEY
from app.view import md_escape
from core.errors import ForkpointError
from core.instruments.effects import (
    effect_correlation,
    stored_effects,
    takeover_effects,
)
from core.instruments.intervals import spearman
from core.instruments.lens import lens
from core.instruments.success_curve import pivot_correlation, success_curve
from core.instruments.token_stats import occurrences, token_stats
from core.scoring.registry import score_label
from core.trace import Trace
from core.views.presentation import quoted_tokens

TRACE_PAGE = Path(__file__).resolve().parent / "screens" / "trace.py"
PROBLEMS_PAGE = Path(__file__).resolve().parent / "screens" / "problems.py"
HIST_STATS = {"n_tokens": "tokens", "max_score": "max score", "top100_mean": "top-100 mean",
              "n_takeovers": "takeovers", "rho": "ρ", "n_spikes": "spikes"}  # per-trace statistic -> its label


# -- figures (plain functions of frames) --------------------------------------------------------


def rho_text(rho: float) -> str:
    """A Spearman ρ for a caption: two decimals, or why there is none (core.instruments.intervals.spearman is NaN
    below 3 finite pairs or with one side constant), never "nan"."""
    return f"{rho:.2f}" if rho == rho else "none yet (it needs 3 or more positions whose values are not all equal)"


def curve_figure(curve: pd.DataFrame) -> go.Figure:
    """P(correct | prefix) at the visited positions with its interval; pivotal tokens marked."""
    fig = go.Figure([
        go.Scatter(x=list(curve["pos"]) + list(curve["pos"][::-1]), y=list(curve["ci_high"]) + list(curve["ci_low"][::-1]),
                   fill="toself", line={"width": 0}, fillcolor="rgba(70,110,200,0.15)", hoverinfo="skip", name="95% interval"),
        go.Scatter(x=curve["pos"], y=curve["p"], mode="lines+markers", line={"shape": "hv"}, name="P(correct)",
                   hovertext=[f"#{r.pos} {r.token!r}: {r.p:.2f} (n = {r.n})" for r in curve.itertuples()], hoverinfo="text"),
    ])
    piv = curve[curve["pivotal"]]
    fig.add_trace(go.Scatter(x=piv["pos"], y=piv["p"] + piv["jump"] / 2, mode="markers", name="pivotal token",
                             marker={"symbol": "star", "size": 14, "color": "#d62728"},
                             hovertext=[f"#{r.pos} {r.token!r}: jump {r.jump:+.2f}" for r in piv.itertuples()],
                             hoverinfo="text"))
    fig.update_layout(height=260, margin={"l": 10, "r": 10, "t": 10, "b": 30}, yaxis={"range": [-0.05, 1.05]},
                      xaxis={"title": "prefix length t"})
    return fig


def lens_figure(frame: pd.DataFrame, pos: int, column: str) -> go.Figure:
    """Layers x {base, reasoner}: the probability in `column` per layer; top tokens on hover."""
    at = frame[frame["pos"] == pos]
    sides = ["base", "reason"]
    layers = sorted(at["layer"].unique())
    z = [[float(at[(at.side == s) & (at.layer == layer)][column].iloc[0]) for s in sides] for layer in layers]
    hover = [["<br>".join(f"{t!r} {p:.3f}" for t, p in zip(*at[(at.side == s) & (at.layer == layer)]
                                                            [["top_tokens", "top_probs"]].iloc[0])) for s in sides]
             for layer in layers]
    fig = go.Figure(go.Heatmap(z=z, x=["base", "reasoner"], y=layers, zmin=0, zmax=1, colorscale="Viridis",
                               hovertext=hover, hoverinfo="text+z", colorbar={"title": "p", "thickness": 10}))
    fig.update_layout(height=60 + 28 * len(layers), margin={"l": 10, "r": 10, "t": 10, "b": 10},
                      yaxis={"title": "layer", "dtick": 1})
    return fig


# -- Trace page -------------------------------------------------------------------------------


def trace_instruments(ctx: Context, trace: Trace) -> None:
    """The Trace page's instruments, in one expander below the token view: lazy (a closed expander or tab runs
    and draws nothing, so a switch or a selection pays for no lens forward pass nor hidden chart)."""
    with st.expander("Instruments: takeover effects, success curve, logit lens", key="instruments_open",
                     on_change="rerun") as box:
        if not box.open:
            return
        if ctx.pair is None:
            st.info("Load a model pair in the sidebar to measure effects or read the lens.")
            return
        tabs = st.tabs(["Effects", "Success curve", "Lens"], key="instruments_tab", on_change="rerun")
        for tab, panel in zip(tabs, (_effects_panel, _curve_panel, _lens_panel)):
            if tab.open:
                with tab:
                    panel(ctx, trace)


def _effects_panel(ctx: Context, trace: Trace) -> None:
    row = st.container(horizontal=True, wrap=True, vertical_alignment="bottom")  # wraps on a narrow window
    samples = row.number_input("Samples per arm", 1, 64, 8, key="fx_samples", width=180)
    where = row.radio("Positions", ["spikes", "selected token"], horizontal=True, key="fx_where", width="content")
    sel = st.session_state.get("sel_pos")
    if st.button("Measure effects", key="fx_run"):
        positions = [sel] if where == "selected token" and sel is not None else None
        bar = st.progress(0.0, text="continuations …")
        try:
            takeover_effects(ctx.pair, trace, positions, int(samples), score=ctx.settings.score, store=ctx.store,
                             progress=lambda d, t: bar.progress(d / max(t, 1), text=f"position {d} of {t}"))
        except ForkpointError as err:
            st.error(md_escape(err, 400))
        else:
            st.rerun()  # the token view above is drawn before this panel: redraw it with the new markers
    frame = stored_effects(ctx.store, trace, score=ctx.settings.score)  # everything measured so far, from the store
    if frame.empty:
        st.caption("No effects measured on this trace yet. Each continuation is stored as a branch, so "
                   "measuring again reuses them.")
        return
    st.caption(f"Each measured token carries a bar over it in the view above (teal: the reasoner's token helps, "
               f"brown: it hurts; hover for the numbers). Effect = accuracy with the reasoner writing the token − "
               f"with the base writing it; 95% Newcombe interval (Wilson for each accuracy). Spearman ρ with "
               f"{score_label(ctx.settings.score)}: {rho_text(effect_correlation(frame))} over {len(frame)} "
               f"position(s).")
    cols = ["pos", "token", "base_token", "reason_token", "acc_with", "acc_without", "effect", "ci_low", "ci_high", "n"]
    st.dataframe(frame[cols], hide_index=True, width="stretch", key="fx_table")
    options = [(k, f"#{r.pos} {arm}") for r in frame.itertuples() for arm, keys in
               (("reasoner wrote it", r.keys_with), ("base wrote it", r.keys_without)) for k in keys.split()]
    pick = st.selectbox("Open a continuation", options, format_func=lambda o: f"{o[1]} · {o[0][:8]}", key="fx_open")
    if pick and st.button("Open", key="fx_open_go"):
        state.open_trace(pick[0], (trace.meta.get("problem") or {}).get("id"), int(pick[1].split()[0][1:]))
        st.rerun()


def _curve_panel(ctx: Context, trace: Trace) -> None:
    c1, c2 = st.columns(2)
    samples = c1.number_input("Samples per prefix", 1, 64, 8, key="curve_samples")
    threshold = c2.slider("Jump threshold", 0.05, 1.0, 0.2, 0.05, key="curve_threshold")
    cache = st.session_state.setdefault("curves", {})
    name = (trace.key, int(samples), float(threshold))
    if st.button("Compute the success curve", key="curve_run"):
        with st.spinner("Sampling the base's continuations at the prefixes the search visits …"):
            try:
                cache[name] = success_curve(ctx.pair, trace, int(samples), threshold=float(threshold),
                                            score=ctx.settings.score, store=ctx.store)
            except ForkpointError as err:
                st.error(md_escape(err, 400))
    curve = cache.get(name)
    if curve is None:
        st.caption("P(correct | the first t tokens), from the base's continuations at t, searched by bisection "
                   "(Pivotal Token Search): its jumps are the pivotal tokens.")
        return
    st.plotly_chart(curve_figure(curve), key="curve_fig", width="stretch")
    st.caption(f"{int(curve['pivotal'].sum())} pivotal token(s) of {len(trace)}; Spearman ρ of |jump| and "
               f"{score_label(ctx.settings.score)}: {rho_text(pivot_correlation(curve))}.")


def _lens_panel(ctx: Context, trace: Trace) -> None:
    sel = st.session_state.get("sel_pos")
    if sel is None or not 0 <= sel < len(trace):
        st.caption("Select a token in the view above to read each layer of both models at it.")
        return
    column = st.radio("Probability of", ["p_emitted", "p_reason_top"], horizontal=True, key="lens_col",
                      format_func=lambda c: "the emitted token" if c == "p_emitted" else "the reasoner's top choice")
    try:
        frame = lens(ctx.pair, trace, int(sel), k=5)
    except ForkpointError as err:
        st.error(md_escape(err, 400))
        return
    st.plotly_chart(lens_figure(frame, int(sel), column), key="lens_fig", width="stretch")
    st.caption(f"Token #{sel} {md_escape(repr(trace.tokens[sel]))}: each layer's residual read through that model's "
               "final norm and head (the logit lens); the last layer is the model's own distribution.")


# -- Dataset page -----------------------------------------------------------------------------


@st.cache_data(show_spinner=False, max_entries=8)
def _token_table(path: str, keys: tuple[str, ...], score: str, by: str, stamp: int) -> pd.DataFrame:
    """Token statistics with the effects measured on these traces (`stamp`: the store's size, so new ones count)."""
    measured = _measured(path, keys, score, stamp)
    return token_stats(resources.stored_traces(path, keys), score=score, by=by,
                       effects=None if measured.empty else measured)


@st.cache_data(show_spinner=False, max_entries=8)
def _measured(path: str, keys: tuple[str, ...], score: str, stamp: int) -> pd.DataFrame:
    """Effects rebuilt from the stored continuations (`stamp`: the store's size, so new ones show)."""
    store = resources.get_store(path)
    kids = store.children_index()
    frames = [stored_effects(store, trace, score=score, children=kids.get(trace.key, []))
              for trace in resources.stored_traces(path, keys)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def dataset_instruments(ctx: Context, keys: tuple[str, ...]) -> None:
    """The Dataset page's instruments: token statistics, effect vs disagreement, a per-trace histogram (lazy
    tabs: only the open one runs)."""
    st.subheader("Tokens, effects and triage")
    tabs = st.tabs(["Token statistics", "Effect vs disagreement", "Per-trace histogram"], key=state.INSTRUMENTS_TAB_KEY,
                   on_change="rerun")
    for tab, draw in zip(tabs, (_token_statistics, _effect_vs_score, _histogram)):
        if tab.open:
            with tab:
                draw(ctx, keys)


def _token_statistics(ctx: Context, keys: tuple[str, ...]) -> None:
    """Per token string (or planning category): how often and how strongly the models disagree; a row opens
    its occurrences."""
    path, score = ctx.settings.store_path, ctx.settings.score
    by = st.radio("Group by", ["token", "tag"], horizontal=True, key="ts_by",
                  format_func=lambda b: "token string" if b == "token" else "planning category")
    table = _token_table(path, keys, score, by, len(ctx.store.summaries()))
    shown = quoted_tokens(table, "token") if by == "token" else table  # ' ' and ' we' visible as what they are
    empty = ["mean_effect"] if len(shown) and shown["mean_effect"].isna().all() else []  # no effect measured yet
    if empty:
        st.caption("mean_effect: shown once takeover effects are measured (Trace page, Instruments).")
    event = st.dataframe(shown.drop(columns=empty), hide_index=True, width="stretch", key="ts_table",
                         on_select="rerun", selection_mode="single-row")
    rows = event.selection.rows if event is not None else []
    if rows:
        value = table.iloc[rows[0]][by]
        occ = occurrences(resources.stored_traces(path, keys), value, by=by, score=score)
        st.caption(f"{len(occ)} occurrences of {md_escape(repr(value))}")
        pick = st.selectbox("Open an occurrence", list(occ.itertuples(index=False)), key="ts_open",
                            format_func=lambda r: f"{str(r.trace)[:8]} #{r.pos} (score {r.score:.3g})")
        if pick is not None and st.button("Open at that token", key="ts_go"):
            state.open_trace(str(pick.trace), None, int(pick.pos))
            st.switch_page(TRACE_PAGE, query_params=state.trace_link_params())


def _effect_vs_score(ctx: Context, keys: tuple[str, ...]) -> None:
    """The measured takeover effects against the disagreement score at their positions."""
    path, score = ctx.settings.store_path, ctx.settings.score
    measured = _measured(path, keys, score, len(ctx.store.summaries()))
    if measured.empty:
        st.caption("No effects measured on these traces (Trace page → Instruments, or `forkpoint effects`).")
        return
    fig = go.Figure(go.Scatter(x=measured["score"], y=measured["effect"], mode="markers",
                               error_y={"type": "data", "symmetric": False,
                                        "array": measured["ci_high"] - measured["effect"],
                                        "arrayminus": measured["effect"] - measured["ci_low"]},
                               hovertext=[f"{str(r.trace)[:8]} #{r.pos} {r.token!r}" for r in measured.itertuples()]))
    fig.update_layout(height=320, xaxis_title=score_label(score), yaxis_title="effect (with − without)",
                      margin={"l": 10, "r": 10, "t": 10, "b": 10})
    st.plotly_chart(fig, key="fx_vs_score", width="stretch")
    st.caption(f"Spearman ρ = {rho_text(spearman(measured['score'], measured['effect']))} over {len(measured)} "
               "measured positions: does disagreement predict importance?")


def bars_label(name: str, edges: Sequence[float], bins: Sequence[int]) -> str:
    """The selected histogram bars in words, "ρ in [0.1, 0.2)": neighbouring bars merged, numpy's bins
    half-open except the last (closed)."""
    runs: list[list[int]] = []
    for i in sorted(set(bins)):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    last = len(edges) - 2
    return f"{name} in " + " or ".join(f"[{edges[a]:.3g}, {edges[b + 1]:.3g}{']' if b == last else ')'}"
                                       for a, b in runs)


def _histogram(ctx: Context, keys: tuple[str, ...]) -> None:
    """A per-trace statistic's histogram; a clicked bar filters the Problems table to its traces (LMdiff's
    triage) and opens it there."""
    import numpy as np

    df = ctx.store.summaries()
    df = df[df["key"].astype(str).isin(keys)].reset_index(drop=True)
    stats = [c for c in HIST_STATS if c in df.columns]
    if df.empty or not stats:
        st.caption("No per-trace statistics for these traces.")
        return
    stat = st.selectbox("Statistic", stats, key="hist_stat", format_func=lambda c: HIST_STATS[c])
    values = pd.to_numeric(df[stat], errors="coerce").to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    if not len(finite):
        st.caption(f"No values of {HIST_STATS[stat]}.")
        return
    counts, edges = np.histogram(finite, bins=min(20, max(1, len(np.unique(finite)))))
    fig = go.Figure(go.Bar(x=(edges[:-1] + edges[1:]) / 2, y=counts, width=np.diff(edges) * 0.95,
                           hovertext=[f"{a:.3g} – {b:.3g}: {c} traces" for a, b, c in zip(edges[:-1], edges[1:], counts)],
                           hoverinfo="text"))
    fig.update_layout(height=260, margin={"l": 10, "r": 10, "t": 10, "b": 10}, xaxis_title=HIST_STATS[stat],
                      yaxis_title="traces")
    event = st.plotly_chart(fig, key="hist_fig", on_select="rerun", selection_mode=("points",), width="stretch")
    points = getattr(getattr(event, "selection", None), "points", None) or []
    bins = sorted({int(p["point_index"]) for p in points if "point_index" in p})
    if not bins:
        st.caption("Click a bar to filter the Problems table to its traces.")
        return
    inside = np.zeros(len(values), dtype=bool)
    for i in bins:  # numpy's bins are half-open except the last
        high = values <= edges[i + 1] if i == len(counts) - 1 else values < edges[i + 1]
        inside |= (values >= edges[i]) & high
    subset = {"label": bars_label(HIST_STATS[stat], edges, bins), "keys": df.loc[inside, "key"].astype(str).tolist()}
    if st.session_state.get(SUBSET_KEY) != subset:  # a new bar: filter the Problems table and go there
        st.session_state[SUBSET_KEY] = subset
        st.switch_page(PROBLEMS_PAGE)
    st.page_link(PROBLEMS_PAGE, label=f"Problems table filtered to {md_escape(subset['label'])} ({len(subset['keys'])} traces)",
                 icon=":material/filter_alt:")
