"""Plotly figures of one trace (display only: the numbers come from the trace's metrics)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from core.scoring.registry import METRICS, metric_label, score_label, score_values
from core.trace import Trace


def nice_axis(values: np.ndarray, ticks: int = 4) -> dict:
    """A y-axis from 0 (or the minimum, if negative) with round steps (1, 2, 2.5 or 5 × 10^k)."""
    finite = values[np.isfinite(values)]
    lo = min(0.0, float(finite.min())) if finite.size else 0.0
    hi = float(finite.max()) if finite.size else 1.0
    if hi - lo < 1e-9:
        hi = lo + 1.0
    span = hi - lo
    raw = span / ticks
    power = 10.0 ** np.floor(np.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    bottom = np.floor(lo / step) * step
    top = np.ceil(hi / step) * step
    return {"range": [float(bottom), float(top + 0.04 * (top - bottom))], "tick0": float(bottom), "dtick": float(step),
            "tickformat": "~g"}


def trace_figure(trace: Trace, score: str, height: int = 260) -> go.Figure:
    """Score (and base entropy, unless it is the score) over positions, spikes as markers; every point
    carries its position. Axis titles and the legend use the metric registry's labels."""
    pos = np.arange(len(trace))
    values = np.asarray(score_values(trace.metrics, score), dtype=np.float64)
    label = score_label(score)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=pos, y=values, mode="lines+markers", name=label,
                             marker={"size": 4}, line={"width": 1.5, "color": "#dc2626"}, customdata=pos,
                             hovertemplate="#%{x}: %{y:.3g}<extra>" + label + "</extra>"))
    second = score != "entropy_base"  # the same line twice would hide one and name it twice
    if second:
        entropy = np.asarray(trace.metrics["entropy_base"], dtype=np.float64)
        fig.add_trace(go.Scatter(x=pos, y=entropy, mode="lines", name=metric_label("entropy_base"), yaxis="y2",
                                 line={"width": 1, "color": "#6b7280", "dash": "dot"}, customdata=pos,
                                 hovertemplate="#%{x}: H=%{y:.3g}<extra>base entropy</extra>"))
    spikes = trace.spike_positions
    if spikes:
        fig.add_trace(go.Scatter(x=spikes, y=values[spikes], mode="markers", name="spikes", customdata=spikes,
                                 marker={"size": 10, "symbol": "circle-open", "color": "#7c3aed", "line": {"width": 2}},
                                 hovertemplate="spike #%{x}: %{y:.3g}<extra></extra>"))
    layout = {
        "height": height, "margin": {"l": 10, "r": 10, "t": 10, "b": 30}, "template": "plotly_white",
        "legend": {"orientation": "h", "y": 1.12, "x": 0}, "clickmode": "event+select", "dragmode": False,
        "xaxis": {"title": "position", "tickformat": "d"},
        "yaxis": {"title": METRICS[score].score_label, **nice_axis(values)},
    }
    if second:
        layout["yaxis2"] = {"title": METRICS["entropy_base"].score_label, "overlaying": "y", "side": "right", "showgrid": False,
                            **nice_axis(entropy)}
    fig.update_layout(**layout)
    return fig
