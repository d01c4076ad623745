"""Plotly figures of one trace (display only: the numbers come from the trace's metrics)."""

from __future__ import annotations

from functools import cache

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from core.scoring.registry import METRICS, metric_label, score_label, score_values
from core.trace import Trace
from core.views.presentation import short_label


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


@cache
def _template(name: str) -> dict:
    """A plotly template as plain JSON, validated once per process."""
    return pio.templates[name].to_plotly_json()


def figure(spec: dict) -> go.Figure:
    """The figure of one of this module's specs ({"data": [...], "layout": {...}}, in plotly's full form), built
    without validation: validating a template and three traces costs 50-150 ms on 2 cores, paid on every switch
    for the plot and the graph (tests/test_app_view.py validates every spec in full)."""
    return go.Figure({"data": spec["data"], "layout": {**spec["layout"], "template": _template("plotly_white")}},
                     _validate=False)


def trace_spec(trace: Trace, score: str, height: int = 260) -> dict:
    """Score (and base entropy, unless it is the score) over positions, spikes as markers; every point
    carries its position. Axis titles and the legend use the metric registry's labels."""
    pos = np.arange(len(trace))
    values = np.asarray(score_values(trace.metrics, score), dtype=np.float64)
    label = score_label(score)
    data = [{"type": "scatter", "x": pos, "y": values, "mode": "lines+markers", "name": label,
             "marker": {"size": 4}, "line": {"width": 1.5, "color": "#dc2626"}, "customdata": pos,
             "hovertemplate": "#%{x}: %{y:.3g}<extra>" + label + "</extra>"}]
    second = score != "entropy_base"  # the same line twice would hide one and name it twice
    if second:
        entropy = np.asarray(trace.metrics["entropy_base"], dtype=np.float64)
        data.append({"type": "scatter", "x": pos, "y": entropy, "mode": "lines", "name": metric_label("entropy_base"),
                     "yaxis": "y2", "line": {"width": 1, "color": "#6b7280", "dash": "dot"}, "customdata": pos,
                     "hovertemplate": "#%{x}: H=%{y:.3g}<extra>base entropy</extra>"})
    spikes = list(trace.spike_positions)
    if spikes:
        data.append({"type": "scatter", "x": spikes, "y": values[spikes], "mode": "markers", "name": "spikes",
                     "customdata": spikes, "hovertemplate": "spike #%{x}: %{y:.3g}<extra></extra>",
                     "marker": {"size": 10, "symbol": "circle-open", "color": "#7c3aed", "line": {"width": 2}}})
    layout = {
        "height": height, "margin": {"l": 10, "r": 10, "t": 10, "b": 30},
        "legend": {"orientation": "h", "y": 1.12, "x": 0}, "clickmode": "event+select", "dragmode": False,
        "xaxis": {"title": {"text": "position"}, "tickformat": "d"},
        "yaxis": {"title": {"text": METRICS[score].score_label}, **nice_axis(values)},
    }
    if second:
        layout["yaxis2"] = {"title": {"text": METRICS["entropy_base"].score_label}, "overlaying": "y", "side": "right",
                            "showgrid": False, **nice_axis(entropy)}
    return {"data": data, "layout": layout}


def trace_figure(trace: Trace, score: str, height: int = 260) -> go.Figure:
    """The score plot of one trace (`trace_spec`)."""
    return figure(trace_spec(trace, score, height))


OUTCOME_COLOURS = {True: "#16a34a", False: "#dc2626", None: "#9ca3af"}  # correct / wrong / ungraded


def branch_graph_spec(nodes: list, labels: dict[str, str], open_key: str | None) -> dict:
    """The branch tree (core.views.branch_graph.graph_layout) as a graph: parent → child edges labelled with
    what the child changed, node colour = outcome, the number in a node = its takeovers, a folded subtree a
    square with "+n", the open trace ringed. Every node carries its key (customdata) for a click to open."""
    at = {n.key: n for n in nodes}
    ex, ey, mx, my, mtext, mtip = [], [], [], [], [], []
    for n in nodes:
        if n.parent in at:
            p = at[n.parent]
            ex += [p.depth, p.depth, n.depth, None]
            ey += [p.row, n.row, n.row, None]  # an elbow: down from the parent, then across to the child
            mx.append((p.depth + n.depth) / 2)
            my.append(n.row)
            label = labels.get(n.key, "")
            mtext.append(short_label(label))
            mtip.append(label)
    data = [
        {"type": "scatter", "x": ex, "y": ey, "mode": "lines", "line": {"color": "#cbd5e1", "width": 1.5},
         "hoverinfo": "skip", "showlegend": False},
        {"type": "scatter", "x": mx, "y": my, "mode": "text", "text": mtext, "textposition": "top center",
         "hovertext": mtip, "hoverinfo": "text", "textfont": {"size": 11, "color": "#374151"}, "showlegend": False},
    ]
    for outcome, name in ((True, "correct"), (False, "wrong"), (None, "ungraded")):
        group = [n for n in nodes if (n.correct if n.correct in (True, False) else None) is outcome]
        if not group:
            continue
        data.append({
            "type": "scatter", "x": [n.depth for n in group], "y": [n.row for n in group], "mode": "markers+text",
            "name": name, "text": [f"+{n.folded}" if n.folded else str(n.n_takeovers) for n in group],
            "textposition": "middle center", "textfont": {"size": 10, "color": "white"},
            "customdata": [n.key for n in group],
            "marker": {"size": [26 if n.key == open_key else 20 for n in group], "color": OUTCOME_COLOURS[outcome],
                       "symbol": ["square" if n.folded else "circle" for n in group],
                       "line": {"width": [4 if n.key == open_key else 1 for n in group],
                                "color": ["#f59e0b" if n.key == open_key else "white" for n in group]}},
            "hovertext": [f"{labels.get(n.key) or 'root'} · {n.n_tokens} tokens · {n.n_takeovers} takeover"
                          + ("" if n.n_takeovers == 1 else "s")
                          + (f" · {n.folded} traces folded under it" if n.folded else "")
                          + (" · open" if n.key == open_key else "") + f" · {n.key[:8]}" for n in group],
            "hoverinfo": "text"})  # fmt: skip
    rows = max((n.row for n in nodes), default=0) + 1
    depth = max((n.depth for n in nodes), default=0)
    layout = {"height": int(min(900, 80 + 34 * rows)), "margin": {"l": 10, "r": 10, "t": 30, "b": 10},
              "legend": {"orientation": "h", "y": 1.08, "x": 0}, "clickmode": "event+select", "dragmode": False,
              "xaxis": {"visible": False, "range": [-0.4, depth + 0.6]},
              "yaxis": {"visible": False, "autorange": "reversed"}}
    return {"data": data, "layout": layout}


def branch_graph_figure(nodes: list, labels: dict[str, str], open_key: str | None) -> go.Figure:
    """The branch graph of a tree (`branch_graph_spec`)."""
    return figure(branch_graph_spec(nodes, labels, open_key))
