"""The token view's data for one trace: the one payload the app's component and the notebook widget both draw
(`token_view.js`): escaped heatmap HTML, hover data, spikes, a content version and the legend.

Both edges get the same hover k (settings.HOVER_K), the same rank-shift colours (score "rank_shift":
categorical colours, hover and spikes on the default score) and the same paging (`start`/`end`: one page of a
long trace; `data-pos` stays absolute, spikes are the whole trace's).
"""

from __future__ import annotations

import hashlib
import html
from collections.abc import Callable
from typing import Any

from core import settings
from core.annotate import rank_shift
from core.annotate.spikes import spikes
from core.scoring.registry import DEFAULT_SCORE, score_values
from core.trace import Trace
from core.views.heatmap import front_end_source, heatmap_css, legend_html, text_html, tokens_html
from core.views.presentation import flip_changes, hover_data, tail


def view_payload(trace: Trace, score: str = DEFAULT_SCORE, scale: str = "linear",
                 decode: Callable[[int], str] | None = None, k: int = settings.HOVER_K, vmin: float | None = None,
                 vmax: float | None = None, reference: Any = None, start: int = 0,
                 end: int | None = None) -> dict[str, Any]:
    """The token view's payload for a trace: html, hover data, spikes (the trace's layer, else the top
    settings.SPIKE_TOP), where a flip changes the text (`matters`), offset, n, the colour range [vmin, vmax] (default: the trace's own, so other views can
    share a scale), the legend, and a content version. Only tokens start..end-1 are sent."""
    colours = None
    if score == rank_shift.NAME:  # categorical colours; hover and spikes stay on the default score
        colours, score = rank_shift.colours(trace), DEFAULT_SCORE
    if "spikes" not in trace.annotations:
        trace = spikes(trace, score=score, top=settings.SPIKE_TOP)
    values = score_values(trace.metrics, score)
    lo = _finite(values, min) if vmin is None else vmin
    hi = _finite(values, max) if vmax is None else vmax
    paged = start > 0 or (end is not None and end < len(trace))
    if reference is None and scale == "rank" and paged:
        reference = values  # a page ranks among the whole trace, like the unpaged view
    spikes_all = trace.spike_positions
    matters = flip_changes(trace)  # the whole trace's, like the spikes (n / p walk them; tokens_html marks the page's)
    if paged:
        trace = tail(trace, start, end)
    if colours is not None and paged:
        colours = colours[start:start + len(trace)]
    body = tokens_html(trace, score=score, scale=scale, decode=decode, tips=False, css_tips=False, vmin=lo,
                       vmax=hi, reference=reference, offset=start, colours=colours)
    hover = hover_data(trace, score, decode, k)
    hover["offset"] = int(start)
    hover["bidi"] = settings.BIDI_CONTROLS  # the card shows these as escapes (token_view.js `visible`)
    return {
        "html": body,
        "version": hashlib.blake2b(body.encode("utf-8"), digest_size=8).hexdigest(),
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


def stream_html(trace: Trace, start: int, text: str, *, score: str = DEFAULT_SCORE, scale: str = "linear",
                decode: Callable[[int], str] | None = None, done: bool = False, prefix: str | None = None) -> str:
    """A switch streaming in, drawn as the token view draws it over the live route (token_view.js `reflow`): the
    parent's coloured tokens before `start`, then the new text (escaped) in `fp-live`, in the token view's styles.
    `prefix`: the parent's part as an earlier call returned it (`stream_prefix`), so each update draws only text."""
    if prefix is None:
        prefix = stream_prefix(trace, start, score=score, scale=scale, decode=decode)
    live = f"<span class='fp-live'>{text_html(text)}</span>" + ("" if done else "<span style='color:#2563eb'>▍</span>")
    cut = prefix.rfind("</div>")
    body = prefix[:cut] + live + prefix[cut:] if cut >= 0 else prefix + live
    return framed_view(body)


def framed_view(body: str, outcome: str | None = None, key: str | None = None) -> str:
    """Heatmap HTML (`body`: tokens_html, already escaped) framed as token_view.js draws it, with the token view's
    styles: the outcome line (escaped here) above the text in `fp-scroll` (`data-key`: the trace's key). A
    stream's frame (`stream_html`) and the app's first paint of a shared link (app/first_paint.py) are this."""
    line = f"<div class='fp-outcome'>{html.escape(outcome)}</div>" if outcome else ""
    attr = f" data-key='{html.escape(key, quote=True)}'" if key else ""
    return (f"<style>{heatmap_css()}{front_end_source('token_view.css')}</style>"
            f"<div class='fp-view'>{line}<div class='fp-scroll'{attr}>{body}</div></div>")


def stream_prefix(trace: Trace, start: int, *, score: str = DEFAULT_SCORE, scale: str = "linear",
                  decode: Callable[[int], str] | None = None) -> str:
    """The heatmap HTML of `trace`'s tokens before `start`, coloured on the whole trace's scale (a stream's part
    that stays)."""
    if start <= 0:
        return '<div class="fp-heatmap"></div>'
    return view_payload(trace, score, scale, decode, end=start)["html"]


def _finite(values: Any, pick: Callable) -> float | None:
    finite = [float(v) for v in values if v == v and abs(float(v)) != float("inf")]
    return pick(finite) if finite else None
