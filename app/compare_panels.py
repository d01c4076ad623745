"""Panels for issue 15's views: rank-shift plots, reasoners side by side, stacked heatmap rows, notes.

Display only: the numbers come from core.annotate.rank_shift, core.analysis.comparison and core.io.notes. Pages call these
functions (the Dataset page its two tabs, the Compare page its rows, the Trace and Problems pages notes).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.view import md_escape
from core.annotate import rank_shift as rs
from core.errors import ForkpointError
from core.analysis.comparison import Comparison, dataset_tables, group_by_reasoner
from core.scoring.registry import score_label
from core.trace import Trace
from core.views.heatmap import heatmap_css, legend_html, tokens_html

_ROWS_CSS = (".fp-row{display:grid;grid-template-columns:160px 1fr;gap:8px;align-items:start;margin:4px 0}"
             ".fp-row .name{font:600 12px system-ui;color:#374151;overflow-wrap:anywhere}")
_LAYOUT = {"template": "plotly_white", "margin": {"l": 10, "r": 10, "t": 30, "b": 30}, "height": 320}


# -- rank shift -------------------------------------------------------------------------------------


def rank_shift_figure(table: pd.DataFrame) -> go.Figure:
    """Stacked shares of unshifted / marginal / shifted for each group (all tokens, spikes, takeovers)."""
    fig = go.Figure()
    for cat in rs.CATEGORIES:
        fig.add_trace(go.Bar(x=table["group"], y=table[f"{cat}_share"], name=rs.LABELS[cat],
                             marker_color=rs.COLOURS[cat], marker_line={"color": "#6b7280", "width": 0.5},
                             customdata=table[cat], hovertemplate="%{x}: %{y:.1%} (%{customdata} tokens)<extra></extra>"))
    fig.update_layout(barmode="stack", yaxis={"title": "share of tokens", "tickformat": ".0%"}, **_LAYOUT,
                      legend={"orientation": "h", "y": 1.15, "x": 0})
    return fig


def rank_shift_tab(table: pd.DataFrame, per_trace: pd.DataFrame, score: str, top: float) -> None:
    """The Dataset page's rank-shift tab from `rank_shift.at_positions` (shares at all tokens / spikes /
    takeovers) and `rank_shift.per_trace_table` (per-trace ratios)."""
    ratio = float(table.loc[table["group"] == rs.GROUPS[0], "shifted_share"].iloc[0])  # pooled over all tokens
    st.caption(f"Where the reasoner's top token sits in the base's ranking: unshifted = the base's top, marginal "
               f"= its 2nd–3rd, shifted = lower. Shifted ratio over these traces: **{ratio:.1%}**. Spikes: the top "
               f"{top:.2%} of each trace's tokens by {score_label(score)}; takeovers: tokens the reasoner wrote.")
    st.plotly_chart(rank_shift_figure(table), width="stretch", key="ds_fig_rank_shift")
    if len(per_trace) > 1:
        fig = go.Figure(go.Histogram(x=per_trace["shifted_share"], xbins={"start": 0.0, "end": 1.0001, "size": 0.05},
                                     marker_color=rs.COLOURS["shifted"], marker_line={"color": "#6b7280", "width": 0.5}))
        fig.update_layout(xaxis={"title": "shifted ratio per trace", "tickformat": ".0%", "range": [0, 1]},
                          yaxis={"title": "traces"}, bargap=0.05, **_LAYOUT)
        st.plotly_chart(fig, width="stretch", key="ds_fig_rank_shift_hist")
    with st.expander("table"):
        st.dataframe(table, hide_index=True, width="stretch")
        st.dataframe(per_trace, hide_index=True, width="stretch")


# -- reasoners side by side ---------------------------------------------------------------------------


def reasoner_tables(traces: Sequence[Trace], score: str, top: float) -> tuple[list[str], dict[str, pd.DataFrame] | str]:
    """(the reasoners of `traces`, `comparison.dataset_tables` when there are two or more, or why not)."""
    groups = group_by_reasoner(traces)
    if len(groups) < 2:
        return list(groups), {}
    try:
        return list(groups), dataset_tables(groups, score=score, top=top)
    except ForkpointError as err:
        return list(groups), str(err)


def reasoners_tab(names: list[str], out: dict[str, pd.DataFrame] | str) -> None:
    """The Dataset page's reasoner tab (from `reasoner_tables`): Gini, position density, enrichment and
    shifted ratio per reasoner."""
    if len(names) < 2:
        st.info(f"These traces come from one reasoner ({', '.join(names) or 'none'}). Score the same responses "
                "against another reasoner on the Compare page (or select traces of several pairs) to compare them.")
        return
    if isinstance(out, str):
        st.warning(md_escape(out, 400))
        return
    st.dataframe(out["summary"], hide_index=True, width="stretch",
                 column_config={"gini": st.column_config.NumberColumn(format="%.3f"),
                                "median_u": st.column_config.NumberColumn("median spike position", format="%.2f"),
                                "shifted_ratio": st.column_config.NumberColumn(format="percent")})
    dens = out["position_density"]
    fig = go.Figure()
    for name, part in dens.groupby("reasoner", sort=False):
        fig.add_trace(go.Scatter(x=(part["bin_left"] + part["bin_right"]) / 2, y=part["density"], mode="lines+markers",
                                 name=str(name)))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#9ca3af")
    fig.update_layout(xaxis={"title": "position in the response (t / T)"}, yaxis={"title": "spike density"}, **_LAYOUT)
    st.plotly_chart(fig, width="stretch", key="ds_fig_reasoners_density")
    enr = out["enrichment"]
    if not enr.empty:
        part = enr[enr["set"] == "top_score"]
        fig = go.Figure([go.Bar(x=p["category"], y=p["enrichment"], name=str(n)) for n, p in part.groupby("reasoner", sort=False)])
        fig.add_hline(y=1.0, line_dash="dot", line_color="#9ca3af")
        fig.update_layout(barmode="group", yaxis={"title": "enrichment at spikes (× base rate)"}, **_LAYOUT)
        st.plotly_chart(fig, width="stretch", key="ds_fig_reasoners_enrichment")


# -- stacked heatmap rows ------------------------------------------------------------------------------


def stacked_rows_html(comp: Comparison, score: str, decode: Callable[[int], str] | None = None,
                      selected: int | None = None, mode: str = "score") -> str:
    """One heatmap row per reasoner, aligned by token, on one shared colour range (escaped by core.views.heatmap).
    mode "rank_shift" colours by rank-shift category instead."""
    lo, hi = comp.value_range(score)
    parts = [f"<style>{heatmap_css()}{_ROWS_CSS}</style>"]
    parts.append(rs.swatches_html() if mode == rs.NAME else legend_html(score=score, vmin=lo, vmax=hi,
                                                                          range_note="shared by the rows"))
    for name, trace in zip(comp.names, comp.traces):
        body = tokens_html(trace, score=score, spikes=[], selected=selected, decode=decode, vmin=lo, vmax=hi, k=3,
                           colours=rs.colours(trace) if mode == rs.NAME else None)
        parts.append(f'<div class="fp-row"><div class="name">{html.escape(name)}</div><div>{body}</div></div>')
    return "".join(parts)
