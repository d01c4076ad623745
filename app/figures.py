"""Plotly figures of one trace (display only: the numbers come from the trace's metrics)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from app.view import SCORE_LABELS, spike_list
from core.metrics import score_values
from core.trace import Trace


def trace_figure(trace: Trace, score: str, height: int = 260) -> go.Figure:
    """Score and base entropy over positions, spikes as markers; every point carries its position."""
    pos = np.arange(len(trace))
    values = np.asarray(score_values(trace.metrics, score), dtype=np.float64)
    entropy = np.asarray(trace.metrics["entropy_base"], dtype=np.float64)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=pos, y=values, mode="lines+markers", name=SCORE_LABELS.get(score, score),
                             marker={"size": 4}, line={"width": 1.5, "color": "#dc2626"}, customdata=pos,
                             hovertemplate="#%{x}: %{y:.3f}<extra>score</extra>"))
    fig.add_trace(go.Scatter(x=pos, y=entropy, mode="lines", name="base entropy", yaxis="y2",
                             line={"width": 1, "color": "#6b7280", "dash": "dot"}, customdata=pos,
                             hovertemplate="#%{x}: H=%{y:.3f}<extra>base entropy</extra>"))
    spikes = spike_list(trace)
    if spikes:
        fig.add_trace(go.Scatter(x=spikes, y=values[spikes], mode="markers", name="spikes", customdata=spikes,
                                 marker={"size": 10, "symbol": "circle-open", "color": "#7c3aed", "line": {"width": 2}},
                                 hovertemplate="spike #%{x}: %{y:.3f}<extra></extra>"))
    fig.update_layout(
        height=height, margin={"l": 10, "r": 10, "t": 10, "b": 30}, template="plotly_white",
        legend={"orientation": "h", "y": 1.12, "x": 0}, clickmode="event+select", dragmode=False,
        xaxis={"title": "position"}, yaxis={"title": "score"},
        yaxis2={"title": "entropy", "overlaying": "y", "side": "right", "showgrid": False},
    )
    return fig
