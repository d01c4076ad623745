"""The token heatmap as a bidirectional Streamlit component (`st.components.v2`).

Python sends the token view's payload (`core.views.token_payload.view_payload`, the notebook widget's too:
escaped heatmap HTML with one `data-pos` span per token, plus compact hover data); the browser draws hover cards with textContent (never as HTML),
marks the selected token, and sends clicks and next/previous-spike keys back as `{"pos": i}` (and, once, `{"drawn": true}`
when the app holds its charts until the text is on screen: `data["charts_waiting"]`).
The HTML does not depend on the selection, so a click re-sends only the small `selected` field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from core.views.heatmap import front_end_source, heatmap_css

COMPONENT_NAME = "forkpoint_token_view"


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
