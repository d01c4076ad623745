"""The token heatmap as a bidirectional Streamlit component (`st.components.v2`).

Python sends the escaped heatmap HTML (from `core.heatmap.tokens_html`, one `data-pos` span per
token) plus compact hover data; the browser draws hover cards with textContent (never as HTML),
marks the selected token, and sends clicks and next/previous-spike keys back as `{"pos": i}`.
The HTML does not depend on the selection, so a click re-sends only the small `selected` field.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import streamlit as st

from app.view import hover_data, spike_list
from core.metrics import DEFAULT_SCORE, score_values
from core.heatmap import heatmap_css, legend_html, tokens_html
from core.trace import Trace

_HERE = Path(__file__).resolve().parent
COMPONENT_NAME = "forkpoint_token_view"
HOVER_K = 10  # top-k rows on the hover card


def build_view(trace: Trace, score: str = DEFAULT_SCORE, scale: str = "linear",
               decode: Callable[[int], str] | None = None, k: int = HOVER_K) -> dict[str, Any]:
    """The component payload for an annotated trace: html, hover data, spikes and a content version.

    This is the whole server-side render (benchmarks/bench_render.py times it).
    """
    values = score_values(trace.metrics, score)
    body = tokens_html(trace, score=score, scale=scale, decode=decode, tips=False, css_tips=False)
    version = hashlib.blake2b(body.encode("utf-8"), digest_size=8).hexdigest()
    return {
        "html": body,
        "version": version,
        "hover": hover_data(trace, score, decode, k),
        "spikes": spike_list(trace),
        "n": len(trace),
        "legend": legend_html(trace.annotations.get("tags"), score=score, scale=scale,
                              vmin=_finite(values, min), vmax=_finite(values, max)),
    }


def _finite(values: Any, pick: Callable) -> float | None:
    finite = [float(v) for v in values if v == v and abs(float(v)) != float("inf")]
    return pick(finite) if finite else None


def _read(name: str) -> str:
    return (_HERE / name).read_text(encoding="utf-8")


@st.cache_resource(show_spinner=False)
def _component() -> Callable[..., Any]:
    """Register the component once per process."""
    css = heatmap_css() + "\n" + _read("token_view.css")
    return st.components.v2.component(COMPONENT_NAME, js=_read("token_view.js"), css=css, isolate_styles=True)


def token_view(view: dict[str, Any], *, selected: int | None, key: str,
               on_click: Callable[[], None] | None = None, height: int | None = None) -> Any:
    """Mount the component; returns its result (`.click` is {"pos": i} on the run after a click)."""
    data = {**{k: v for k, v in view.items() if k != "legend"}, "selected": selected, "height": height}
    mount = _component()
    return mount(key=key, data=data, on_click_change=on_click or (lambda: None))
