"""A shared link's first paint: the page's shell (Streamlit's index.html) carries the open trace's token view as
plain HTML, so a fresh browser shows the text before it has fetched and run Streamlit's ~120 script files. A Dataset
link's shell carries its first chart: the figure the page's first tab draws (app/dataset_panels.py), drawn by the
plotly.js inside Streamlit's own Plotly chunk, which the shell loads at once instead of when Streamlit's first chart
asks for it (so plotly.js is loaded and run once, and Streamlit's chart finds it ready).

`FirstPaint` is ASGI middleware (app/serve.py puts it in `st.App`'s middleware): a GET of the Trace page with
`?trace=KEY` gets the shell with the trace's token view built by the live view's own builder
(`resources.view_payload` -> `core.views.token_payload.view_payload`: the same escaped tokens, heatmap colours
and classes) and framed as token_view.js frames it (`core.views.token_payload.framed_view`), outside React's
`#root`. A small script removes it the moment the live token view has drawn its tokens (or the page shows an
error, or another page opens), so the two are never on screen together. Anything unusual (a comparison, a
calibrated gate, a trace not in the store, a slow store) serves the plain shell.

Every page's shell also carries `PAGE_JS`, the app's page rules that must hold from Streamlit's first message: one
browser-history entry per trace, a narrow window's closed sidebar, and no arrow keys kept by an option clicked with the
pointer (`streamlit run app/main.py` serves no shell of ours: no page rules there).
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import streamlit
from streamlit import config

log = logging.getLogger(__name__)

PAINT_ID = "fp-first-paint"
NARROW_PX = 1100  # below this width the shell closes the sidebar (Streamlit's "auto" closes it only below 768 px)
# JS: every page's rules, run before Streamlit's own script (a module, run once the shell is parsed).
# - Streamlit pushes a browser-history entry for every change of the URL; a change that keeps the page and the open
#   trace (a selection, a setting, the problem a shared link left out) replaces the entry instead, so the history holds
#   one entry per switch state and Back / Forward walk the states b / f walk (from Streamlit's first push on).
# - On a narrow window the sidebar takes a third of the width and squeezes the page's controls: closed once per page
#   load, the user may open it again. Streamlit keeps that close as its stored choice; the next load on a wide window
#   opens a sidebar only this rule closed (MARK: no click of the user's on the sidebar's toggles since).
# - A pointer click on an option of a radio group (the Trace page's click mode) leaves the keyboard focus there, and the
#   option's arrow keys would walk the group instead of the token view's cursor: it gives the focus up. An option
#   reached with Tab, or chosen with Space, keeps it.
PAGE_JS = """(() => {
  const push = history.pushState.bind(history);
  history.pushState = (state, title, url) => {
    try {
      const next = new URL(url, location.href), cur = new URL(location.href), key = cur.searchParams.get("trace");
      if (key && next.pathname === cur.pathname && next.searchParams.get("trace") === key) {
        return history.replaceState(state, title, url);
      }
    } catch (err) { /* an unparsable URL: Streamlit's own way */ }
    return push(state, title, url);
  };
  const MARK = "fpSidebarClosedForWidth", narrow = innerWidth < %(narrow)d;
  const stored = (f) => { try { return f(localStorage); } catch (err) { return null; } };
  addEventListener("click", (e) => {
    const at = e.isTrusted && e.target.closest ? e.target : null;
    if (at && at.closest('[data-testid="stSidebarCollapseButton"], [data-testid="stExpandSidebarButton"]')) {
      stored((s) => s.removeItem(MARK));  // the user's own choice from now on
    }
    const group = at && e.detail ? at.closest('[role="radiogroup"]') : null;  // detail 0: the keyboard clicked
    if (group) setTimeout(() => { if (group.contains(document.activeElement)) document.activeElement.blur(); });
  }, true);
  const ours = stored((s) => s.getItem(MARK));
  if (!narrow && !ours) return;
  const fit = () => {  // true once the sidebar is as this window wants it
    const bar = document.querySelector('[data-testid="stSidebar"]');
    if (!bar) return false;
    const closed = bar.dataset.collapsed === "true";
    if (narrow === closed) { if (!narrow) stored((s) => s.removeItem(MARK)); return true; }
    const toggle = document.querySelector(narrow ? '[data-testid="stSidebarCollapseButton"] button'
                                                 : '[data-testid="stExpandSidebarButton"]');
    if (!toggle) return false;
    toggle.click();
    stored((s) => narrow ? s.setItem(MARK, "1") : s.removeItem(MARK));
    return true;
  };
  if (fit()) return;
  const watch = new MutationObserver(() => { if (fit()) watch.disconnect(); });
  watch.observe(document.documentElement, { childList: true, subtree: true });
})();"""
TRACE_PAGES = ("", "home", "trace")  # url paths of the Trace page (app/main.py serves it at each: "" the default page)
DATASET_PAGE = "dataset"
STATIC_JS = Path(streamlit.__file__).parent / "static" / "static" / "js"  # Streamlit's frontend, as it serves it
BUILD_TIMEOUT_S = 3.0  # past this the plain shell is served (the live view draws the text as before)
DATASET_TIMEOUT_S = 1.0  # a Dataset shell waits at most this for its chart (the analysis grows with the store; it goes
                         # on in the background and the page's own run finds its tables cached)
# JS: remove the first paint once the live token view (a v2 component: its tokens in a shadow root) has drawn its
# tokens, an error or warning shows (an info box is no reason), or the user has gone to another page (where a flip
# changes the text is marked in the HTML, by core.views.heatmap.tokens_html, as on the live view). Checked once per
# mutation batch, in the same frame the live view draws, so the two are never painted together.
REMOVE_JS = """(() => {
  const paint = document.getElementById("%(id)s");
  if (!paint) return;
  const path = location.pathname, watched = new WeakSet(), observers = [];
  let gone = false;
  const drop = (why) => {  // why: "live" | "page" | "alert", kept for whoever checks (tests/test_browser.py)
    gone = true; observers.forEach((o) => o.disconnect()); paint.remove(); window.__fpFirstPaintGone = why;
  };
  const check = () => {
    if (gone) return;
    if (location.pathname !== path) return drop("page");
    for (const host of document.querySelectorAll("[data-testid^='stBidiComponent'], [data-testid^='stBidiComponent'] *")) {
      const root = host.shadowRoot;
      if (!root) continue;
      if (root.querySelector(".fp-scroll [data-pos]")) return drop("live");
      if (!watched.has(root)) { watched.add(root); watch(root); }
    }
    if (document.querySelector('[data-testid="stMain"] [data-testid="stAlertContainer"][role="alert"], [data-testid="stException"]')) drop("alert");
  };
  const watch = (node) => { const o = new MutationObserver(check); o.observe(node, { childList: true, subtree: true }); observers.push(o); };
  watch(document.body);
})();"""
# where the live token view is drawn (app/trace_panels.py: the left column of the wide layout, under the header):
# near enough that the text does not jump far when the live view replaces it
PAINT_CSS = ("#%(id)s { position: absolute; z-index: 999990; top: 5.5rem; left: 0; right: 0; margin: 0 auto;"
             " padding: 0 5rem; max-width: 1400px; box-sizing: border-box; pointer-events: none; }"
             " #%(id)s .fp-view { width: 58%%; background: #fff; }"
             " @media (max-width: 900px) { #%(id)s { padding: 0 1rem; } #%(id)s .fp-view { width: 100%%; } }")

# JS: remove a Dataset link's first chart once Streamlit's own chart is drawn in the page (inside stMain: the paint is
# outside React's root), an error, warning or info box shows there, the user presses a key or the pointer or scrolls
# (the widgets beside the paint are live, and Streamlit scrolls its own container, not the paint), or another page opens
DATASET_REMOVE_JS = """(() => {
  const paint = document.getElementById("%(id)s");
  if (!paint) return;
  const path = location.pathname;
  let gone = false;
  const observer = new MutationObserver(() => check());
  const drop = (why) => {
    if (gone) return;
    gone = true; observer.disconnect(); paint.remove(); window.__fpFirstPaintGone = why;
  };
  const check = () => {
    if (location.pathname !== path) return drop("page");
    if (document.querySelector('[data-testid="stMain"] .js-plotly-plot .main-svg')) return drop("live");
    if (document.querySelector('[data-testid="stMain"] [data-testid="stAlertContainer"], [data-testid="stException"]')) drop("alert");
  };
  observer.observe(document.body, { childList: true, subtree: true });
  for (const kind of ["pointerdown", "keydown", "wheel", "touchstart"]) {
    window.addEventListener(kind, () => drop("input"), { capture: true, once: true, passive: true });
  }
})();"""
# JS (a module): load Streamlit's Plotly chunk now, from where Streamlit's own main script comes (its plotly.js sets
# window.Plotly), and draw the figure with it; the paint goes if that fails
DATASET_DRAW_JS = """const fig = %(figure)s;
const paint = document.getElementById("%(id)s");
const main = document.querySelector('script[type="module"][src*="/static/js/"]');
const chunk = new URL("%(chunk)s", main ? main.src : new URL("./static/js/", location.href));
import(chunk.href).then(() => {
  const el = paint && paint.isConnected && paint.querySelector(".fp-chart");
  if (el && window.Plotly) return window.Plotly.newPlot(el, fig.data, fig.layout, { staticPlot: true, responsive: true });
  if (paint) paint.remove();
}).catch(() => { if (paint) paint.remove(); });"""
# where Streamlit draws the page's first chart in a fresh session (measured in Chromium from 700 to 1,920 px wide):
# beside the open sidebar (300 px; closed below NARROW_PX by PAGE_JS), under the title, the filters, the tabs and the
# analysis's caption (one line lower below 1,200 px, where the caption wraps beside the sidebar), 5 rem padding (1 rem
# below 864 px), as high as the figure; a few pixels off is fine: Streamlit's own chart replaces it
DATASET_CSS = ("#%(id)s { position: absolute; z-index: 999990; top: 447px; left: 300px; right: 0;"
               " padding: 0 5rem; box-sizing: border-box; pointer-events: none; }"
               " #%(id)s .fp-chart { height: %(height)spx; background: #fff; }"
               " @media (max-width: 1199px) { #%(id)s { top: 470px; } }"
               " @media (max-width: %(narrow)spx) { #%(id)s { left: 0; top: 447px; } }"
               " @media (max-width: 863px) { #%(id)s { padding: 0 1rem; } }")


def _query(scope: Mapping[str, Any]) -> dict[str, str]:
    raw = scope.get("query_string", b"").decode("latin-1")
    return {k: v[0] for k, v in parse_qs(raw, keep_blank_values=True).items() if v}


def page_path(path: str) -> str | None:
    """The app's url path of a request path ("" for the default page) under server.baseUrlPath; None when the
    request is not for a page (Streamlit's own routes, static files, the live route)."""
    base = (config.get_option("server.baseUrlPath") or "").strip("/")
    rest = path.strip("/")
    if base:
        if rest != base and not rest.startswith(base + "/"):
            return None
        rest = rest[len(base):].strip("/")
    if rest.startswith("_stcore") or rest.startswith("static") or rest.startswith("component") or "." in rest:
        return None
    return rest


def store_path() -> str:
    """The store a fresh session opens: the one the app was started with (`--store`), else the default."""
    # deferred: app.resources pulls in torch (see trace_paint)
    from app import resources
    from app.config import parse_args, script_args

    return resources.store_path(parse_args(script_args(sys.argv)).store)


def _url_view(query: Mapping[str, str]) -> dict[str, str]:
    """The view settings a fresh session adopts from the URL (app/state.py: metric, scale, range, ...)."""
    from app import state  # deferred, as in trace_paint

    return {name: query.get(param) or state.DEFAULTS[name] for param, name in state.VIEW_PARAMS.items()}


def _top_pct(query: Mapping[str, str]) -> float | None:
    """The URL's "top p%" spike share as a fresh session adopts it (out of range: the default); None for a
    calibrated gate (it needs the pair) or an unreadable rule: no first paint then."""
    from app import state  # deferred, as in trace_paint

    rule = state.parse_spike(query["spikes"]) if query.get("spikes") else {"spike_kind": "top"}
    if rule is None or rule["spike_kind"] != "top":
        return None
    pct = rule.get("spike_top_pct", state.DEFAULTS["spike_top_pct"])
    return pct if state.TOP_PCT_RANGE[0] <= pct <= state.TOP_PCT_RANGE[1] else state.DEFAULTS["spike_top_pct"]


def trace_paint(path: str, key: str, query: Mapping[str, str]) -> str | None:
    """The Trace page's token view of stored trace `key`, as a fresh session with the link's view settings draws it
    (the URL's metric, scale, range, spikes and pos: app/state.py), framed; None when the first paint would differ
    from the live view (a comparison, a calibrated gate) or the trace is not in the store."""
    # deferred: app.resources and the Trace page's modules pull in torch and the app's pages, which the server's
    # module import (app/serve.py) must not wait on
    from app import resources
    from app.config import PairChoice
    from app.context import Context
    from app.sidebar import Settings
    from app.trace_panels import colour_range
    from app.view import RANGES, SpikeRule
    from core.instruments.effects import effects_stamp
    from core.scoring.registry import SCORES
    from core.views.heatmap import SCALES
    from core.views.presentation import PAGE_TOKENS, outcome_line, page_bounds
    from core.views.token_payload import framed_view

    if query.get("compare"):
        return None  # colours shared with the compared traces: the live view's business
    view = _url_view(query)
    pct = _top_pct(query)
    if pct is None:
        return None
    if view["score"] not in SCORES or view["scale"] not in SCALES or view["crange"] not in RANGES:
        return None  # the app repairs these to its defaults (state._repair): so would this, the same way
    store = resources.get_store(path)
    if key not in store:
        return None
    spike_rule = SpikeRule(top=float(pct) / 100.0)
    settings = Settings(store_path=path, problems_path=None, score=view["score"], scale=view["scale"], rule=spike_rule,
                        pair_spec=PairChoice(), crange=view["crange"])
    trace = resources.view_trace(path, key, settings.score, spike_rule.key(), spike_rule)  # the live run's cache
    lo, hi, _, _ = colour_range(Context(settings=settings, pair=None, store=store), trace)
    try:
        sel = int(query["pos"]) if query.get("pos") else None
    except ValueError:
        sel = None
    page = sel // PAGE_TOKENS if sel is not None and 0 <= sel < len(trace) else 0  # the page the live view opens
    start, end = page_bounds(len(trace), page)
    payload = resources.view_payload(path, trace, settings.score, settings.scale, None, lo, hi, start=start, end=end,
                                     effects=bool(effects_stamp(store, key)))
    body = framed_view(payload["html"], outcome_line(trace))  # no data-key: `.fp-scroll[data-key]` is the live view
    return (f"<style>{PAINT_CSS % {'id': PAINT_ID}}</style>"
            f"<div id='{PAINT_ID}' data-page='trace' data-key='{html.escape(key, quote=True)}'"
            f" aria-hidden='true'>{body}</div>"
            f"<script>{REMOVE_JS % {'id': PAINT_ID}}</script>")


@cache
def plotly_chunk() -> str | None:
    """The file name of Streamlit's Plotly chunk (named by its content hash), or None when there is not exactly one."""
    found = sorted(p.name for p in STATIC_JS.glob("PlotlyChart.*.js"))
    return found[0] if len(found) == 1 else None


def dataset_paint(path: str, query: Mapping[str, str]) -> str | None:
    """The Dataset page's first chart as a fresh session draws it (the first tab's figure over the traces a fresh
    page selects, with the URL's metric and spike share); None when the page would show something else first (an
    empty selection, a calibrated gate, an analysis without a figure) or Streamlit's Plotly chunk is not found."""
    # deferred, as in trace_paint
    from app import resources
    from app.dataset_panels import analysis_figure, analysis_tables, filter_choices, selected_keys
    from app.view import with_policy_labels
    from core.analysis.registry import list_analyses
    from core.scoring.registry import SCORES

    score, pct, chunk = _url_view(query)["score"], _top_pct(query), plotly_chunk()
    if chunk is None or score not in SCORES or pct is None:
        return None
    summaries = resources.get_store(path).summaries()
    if summaries.empty:
        return None
    summaries = with_policy_labels(summaries)
    keys, _ = selected_keys(summaries, [default for _, default in filter_choices(summaries).values()])
    spec = list_analyses()[0]
    if not keys or not spec.figure:
        return None
    tables = analysis_tables(spec.name, path, keys, score, float(pct) / 100.0, None)
    figure = analysis_figure(spec, tables, {name: values[0] for name, values in spec.options.items()})
    data = figure.to_json().replace("<", "\\u003c")  # inside a script element: nothing in it can end it early
    draw = DATASET_DRAW_JS % {"figure": data, "chunk": chunk, "id": PAINT_ID}
    height = int(figure.layout.height or 450)  # plotly's default
    return (f"<style>{DATASET_CSS % {'id': PAINT_ID, 'height': height, 'narrow': NARROW_PX - 1}}</style>"
            f"<div id='{PAINT_ID}' data-page='dataset' aria-hidden='true'><div class='fp-chart'></div></div>"
            f"<script type='module' async>{draw}</script><script>{DATASET_REMOVE_JS % {'id': PAINT_ID}}</script>")


def warm() -> None:
    """Import what `trace_paint` needs (the Trace page's modules, core's views), so the first shell served after
    the server starts is not the one that waits for them (1.2 s at load 6)."""
    from app import dataset_panels, trace_panels  # noqa: F401 - imported for their side effect: the modules are loaded
    from core.views import token_payload  # noqa: F401


def paint_for(path: str, query: Mapping[str, str]) -> str | None:
    """The first paint for a page request (`path`: the app's url path), or None (the plain shell)."""
    if path in TRACE_PAGES and query.get("trace"):
        return trace_paint(store_path(), str(query["trace"]), query)
    if path == DATASET_PAGE:
        return dataset_paint(store_path(), query)
    return None


def page_rules() -> str:
    """The script every page's shell carries (PAGE_JS), ahead of any first paint."""
    return f"<script>{PAGE_JS % {'narrow': NARROW_PX}}</script>"


def inject(shell: bytes, paint: str) -> bytes:
    """Streamlit's index.html with `paint` right after React's root element (outside it: React never touches it)."""
    text = shell.decode("utf-8")
    marker = '<div id="root"></div>'
    at = text.find(marker)
    if at < 0:
        at = text.rfind("</body>")
        if at < 0:
            return shell
    else:
        at += len(marker)
    return (text[:at] + paint + text[at:]).encode("utf-8")


class FirstPaint:
    """ASGI middleware: a page request gets Streamlit's shell with the page rules (`PAGE_JS`) and its first paint, if
    it has one (`paint_for`), inside, uncompressed and never cached (the same shell names other traces on other links);
    every other request passes."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "GET":
            return await self.app(scope, receive, send)
        path = page_path(scope.get("path", ""))
        if path is None:
            return await self.app(scope, receive, send)
        query = _query(scope)
        paint = None
        if (path in TRACE_PAGES and query.get("trace")) or path == DATASET_PAGE:
            try:
                limit = DATASET_TIMEOUT_S if path == DATASET_PAGE else BUILD_TIMEOUT_S
                paint = await asyncio.wait_for(asyncio.to_thread(paint_for, path, query), limit)
            except Exception as err:  # noqa: BLE001 - a first paint is an extra: the shell without it is the page
                log.info("first paint skipped: %r", err)
        paint = page_rules() + (paint or "")
        # the whole shell, uncompressed and fresh (a 304 would reuse a cached shell naming another trace)
        drop = {b"accept-encoding", b"if-none-match", b"if-modified-since"}
        inner = {**scope, "headers": [(k, v) for k, v in scope.get("headers", []) if k.lower() not in drop]}
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def hold(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                await _send_shell(send, start, b"".join(chunks), paint)
                return
            await send(message)

        await self.app(inner, receive, hold)


async def _send_shell(send: Any, start: Mapping[str, Any], body: bytes, paint: str) -> None:
    headers = list(start.get("headers", []))
    kind = next((v for k, v in headers if k.lower() == b"content-type"), b"")
    encoded = any(k.lower() == b"content-encoding" for k, _ in headers)
    if start.get("status") == 200 and kind.startswith(b"text/html") and not encoded:
        body = inject(body, paint)
        headers = [(k, v) for k, v in headers if k.lower() not in (b"content-length", b"etag", b"last-modified",
                                                                     b"cache-control")]
        headers += [(b"content-length", str(len(body)).encode()), (b"cache-control", b"no-store")]
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": body})
