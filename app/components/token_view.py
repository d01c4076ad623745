"""The token heatmap as a bidirectional Streamlit component (`st.components.v2`).

Python sends the escaped heatmap HTML (from `core.views.heatmap.tokens_html`, one `data-pos` span per
token) plus compact hover data; the browser draws hover cards with textContent (never as HTML),
marks the selected token, and sends clicks and next/previous-spike keys back as `{"pos": i}`.
The HTML does not depend on the selection, so a click re-sends only the small `selected` field.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import streamlit as st

from core.scoring.registry import DEFAULT_SCORE, score_values
from core.trace import Trace
from core.views.heatmap import front_end_source, heatmap_css, legend_html, tokens_html
from core.views.presentation import hover_data, switch_points, tail

COMPONENT_NAME = "forkpoint_token_view"
HOVER_K = 20  # most top-k rows on the hover card (a trace may keep more: the selection panel lists all)


def build_view(trace: Trace, score: str = DEFAULT_SCORE, scale: str = "linear",
               decode: Callable[[int], str] | None = None, k: int = HOVER_K, vmin: float | None = None,
               vmax: float | None = None, reference: Any = None, start: int = 0,
               end: int | None = None) -> dict[str, Any]:
    """The component payload for an annotated trace: html, hover data, spikes and a content version.

    Colours use [vmin, vmax] (default: the trace's own range) so that other views can share the scale.
    Only tokens start..end-1 are sent (one page of a long trace; data-pos stays absolute, spikes are the
    whole trace's). This is the whole server-side render (benchmarks/bench_render.py times it).
    """
    values = score_values(trace.metrics, score)
    lo = _finite(values, min) if vmin is None else vmin
    hi = _finite(values, max) if vmax is None else vmax
    if reference is None and scale == "rank" and (start > 0 or (end is not None and end < len(trace))):
        reference = values  # a page ranks among the whole trace, like the unpaged view
    spikes_all = trace.spike_positions
    matters = switch_points(trace)  # the whole trace's, like the spikes (token_view.js marks them)
    if start > 0 or (end is not None and end < len(trace)):
        trace = tail(trace, start, end)
    body = tokens_html(trace, score=score, scale=scale, decode=decode, tips=False, css_tips=False, vmin=lo,
                       vmax=hi, reference=reference, offset=start)
    version = hashlib.blake2b(body.encode("utf-8"), digest_size=8).hexdigest()
    hover = hover_data(trace, score, decode, k)
    hover["offset"] = int(start)
    return {
        "html": body,
        "version": version,
        "hover": hover,
        "spikes": spikes_all,
        "matters": matters,
        "offset": int(start),
        "n": len(trace),
        "vmin": lo,
        "vmax": hi,
        "legend": legend_html(trace.annotations.get("tags"), score=score, scale=scale, vmin=lo, vmax=hi,
                              effects=bool(trace.annotations.get("effects"))),
    }


def _finite(values: Any, pick: Callable) -> float | None:
    finite = [float(v) for v in values if v == v and abs(float(v)) != float("inf")]
    return pick(finite) if finite else None


def _read(name: str) -> str:
    return front_end_source(name)


@st.cache_resource(show_spinner=False)
def _component() -> Callable[..., Any]:
    """Register the component once per process."""
    css = heatmap_css() + "\n" + _read("token_view.css")
    return st.components.v2.component(COMPONENT_NAME, js=_read("token_view.js"), css=css, isolate_styles=True)


def token_view(view: dict[str, Any], *, selected: int | None, key: str,
               on_click: Callable[[], None] | None = None, height: int | None = None, prob_mode: str = "prob") -> Any:
    """Mount the component; returns its result (`.click` is {"pos": i} on the run after a click)."""
    data = {**{k: v for k, v in view.items() if k != "legend"}, "selected": selected, "height": height,
            "prob_mode": prob_mode}
    mount = _component()
    return mount(key=key, data=data, on_click_change=on_click or (lambda: None))
