"""How a `Trace` shows itself in Jupyter (`Trace._repr_html_`): the HTML export's page, hover and all.

The page is exactly `core.views.html_page.html_page` of the annotated trace (spikes, planning tags, notes it
carries), so it is self-contained and works offline. It is shown in an `<iframe srcdoc>` so that its
stylesheet and tooltip script stay inside it; the iframe grows to its content where the front end runs
the onload handler (JupyterLab, VS Code, Colab), else it is a fixed, scrollable height.
"""

from __future__ import annotations

import html
import logging

from core.scoring.registry import DEFAULT_SCORE
from core.trace import Trace
from core.annotate.shown import annotated
from core.views.exports import token_decoder
from core.views.html_page import html_page

log = logging.getLogger(__name__)

MIN_HEIGHT, MAX_HEIGHT = 320, 900  # px, before the onload handler resizes the frame


def page_html(trace: Trace, score: str = DEFAULT_SCORE) -> str:
    """The self-contained HTML page of one trace: the same page `core.export(trace, "x.html")` writes."""
    shown = annotated(trace, score)
    return html_page([shown], score=score, decode=token_decoder([shown]), title=_title(trace))


def _title(trace: Trace) -> str:
    problem = (trace.meta.get("problem") or {}).get("id")
    return f"forkpoint trace {problem}" if problem else "forkpoint trace"


def trace_html(trace: Trace, score: str = DEFAULT_SCORE) -> str:
    """`page_html` in an iframe (srcdoc, escaped), for a notebook's output area."""
    page = page_html(trace, score)
    height = max(MIN_HEIGHT, min(MAX_HEIGHT, 260 + 22 * (len(trace.text) // 90 + trace.text.count("\n"))))
    grow = "try{this.style.height=(this.contentDocument.documentElement.scrollHeight+8)+'px'}catch(e){}"
    return (f'<iframe class="forkpoint-trace" srcdoc="{html.escape(page, quote=True)}" '
            f'style="width:100%;height:{height}px;border:1px solid #e5e7eb;border-radius:6px" '
            f'onload="{grow}" title="{html.escape(_title(trace), quote=True)}"></iframe>')
