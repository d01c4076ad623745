"""app/first_paint.py: every page's shell carries the page rules (PAGE_JS); a shared trace link's shell also the
trace's token view (the live view's own HTML, model text escaped), a Dataset link's its first chart (the page's own
figure, for the plotly.js in Streamlit's Plotly chunk), uncompressed and never cached; other requests pass untouched.
In a browser: tests/test_browser.py (the first paint goes once the live view or Streamlit's chart draws; never both on
screen), tests/test_journeys.py and tests/test_switchboard.py (what the page rules do)."""

from __future__ import annotations

import asyncio
import html
import json
import re

import pytest
from fakes import make_trace

from app import first_paint, resources, state
from app.dataset_panels import analysis_figure, analysis_tables
from app.first_paint import PAINT_ID, STATIC_JS, FirstPaint, inject, page_rules, plotly_chunk
from app.view import SpikeRule
from core.io.store import TraceStore
from core.scoring.registry import DEFAULT_SCORE, score_values
from core.views.colours import value_range
from core.views.presentation import flip_changes

SHELL = b'<!DOCTYPE html><html><head><title>Streamlit</title></head><body><div id="root"></div></body></html>'
RULED = inject(SHELL, page_rules()).decode()  # a page's shell without a first paint
HOSTILE = "Hi <script>alert(1)</script> & <img src=x onerror=alert(1)> \"quoted\" 'single'\nnext"


@pytest.fixture
def stored(tmp_path, monkeypatch):
    """A store holding one trace whose tokens are hostile markup; the app's store is that one."""
    trace = make_trace(text=HOSTILE, annotate=True, seed=3)
    TraceStore(tmp_path).put(trace)
    monkeypatch.setattr(first_paint, "store_path", lambda: str(tmp_path))
    return str(tmp_path), trace


def _get(path: str, query: str = "", method: str = "GET") -> tuple[list[dict], list[dict]]:
    """(the scopes Streamlit's app was called with, the messages sent back) for one request through FirstPaint,
    Streamlit's app answering with SHELL (an ETag'd, cacheable index.html)."""
    seen: list[dict] = []
    sent: list[dict] = []

    async def streamlit(scope, receive, send):
        seen.append(scope)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/html; charset=utf-8"),
                                (b"content-length", str(len(SHELL)).encode()), (b"etag", b'"abc"'),
                                (b"cache-control", b"no-cache")]})
        await send({"type": "http.response.body", "body": SHELL[:40], "more_body": True})
        await send({"type": "http.response.body", "body": SHELL[40:]})

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "query_string": query.encode(),
             "headers": [(b"host", b"127.0.0.1"), (b"accept-encoding", b"gzip, br"), (b"if-none-match", b'"abc"')]}
    asyncio.run(FirstPaint(streamlit)(scope, None, send))
    return seen, sent


def _body(sent: list[dict]) -> str:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode("utf-8")


def _headers(sent: list[dict]) -> dict[bytes, bytes]:
    return dict(sent[0]["headers"])


def _paint(body: str) -> str:
    """The first paint's element (up to the removal script that follows it)."""
    start = body.index(f"<div id='{PAINT_ID}'")
    return body[start:body.index("<script>", start)]


def test_a_trace_link_gets_its_token_view_in_the_shell_escaped_and_uncached(stored):
    path, trace = stored
    for url in ("/", "/trace", "/home"):
        seen, sent = _get(url, f"trace={trace.key}")
        body = _body(sent)
        assert body.count(f"id='{PAINT_ID}'") == 1, url
        assert body.index('<div id="root"></div>') < body.index(PAINT_ID)  # outside React's root
        paint = _paint(body)
        # the live view's own HTML (resources.view_payload, what render_data sends the token view), not a copy
        rule = SpikeRule()
        shown = resources.view_trace(path, trace.key, DEFAULT_SCORE, rule.key(), rule)
        lo, hi = value_range(score_values(shown.metrics, DEFAULT_SCORE))
        live = resources.view_payload(path, shown, DEFAULT_SCORE, "linear", None, lo, hi, effects=False)["html"]
        assert live in paint
        assert len(re.findall(r'data-pos="\d+"', paint)) == len(trace)
        marked = [int(p) for p in re.findall(r'class="tok[^"]*\bfp-matter\b[^"]*" data-pos="(\d+)"', paint)]
        assert marked == flip_changes(shown) and marked and "data-matters" not in paint  # in the HTML (issue 31)
        assert "<script>" not in paint and "<img" not in paint  # model text is never markup
        assert html.escape("<script>") in paint and html.escape("<img") in paint
        headers = _headers(sent)
        assert headers[b"cache-control"] == b"no-store" and b"etag" not in headers
        assert int(headers[b"content-length"]) == len(body.encode("utf-8"))
        asked = dict(seen[0]["headers"])  # the whole shell, uncompressed: never a 304 of a shell naming another trace
        assert b"accept-encoding" not in asked and b"if-none-match" not in asked


def test_the_url_view_settings_colour_the_first_paint_as_the_live_view(stored):
    path, trace = stored
    _, sent = _get("/", f"trace={trace.key}&scale=rank&pos=2")
    rule = SpikeRule()
    shown = resources.view_trace(path, trace.key, DEFAULT_SCORE, rule.key(), rule)
    lo, hi = value_range(score_values(shown.metrics, DEFAULT_SCORE))
    rank = resources.view_payload(path, shown, DEFAULT_SCORE, "rank", None, lo, hi, effects=False)["html"]
    linear = resources.view_payload(path, shown, DEFAULT_SCORE, "linear", None, lo, hi, effects=False)["html"]
    assert rank != linear and rank in _paint(_body(sent))


@pytest.mark.parametrize("url, query, method", [
    ("/static/js/index.js", "trace={key}", "GET"),  # Streamlit's own files
    ("/_stcore/health", "trace={key}", "GET"),
    ("/", "trace={key}", "POST"),
])
def test_other_requests_pass_untouched(stored, url, query, method):
    _, trace = stored
    seen, sent = _get(url, query.format(key=trace.key), method)
    assert _body(sent) == SHELL.decode() and PAINT_ID not in _body(sent)
    assert dict(seen[0]["headers"]).get(b"accept-encoding") == b"gzip, br"  # the request reached Streamlit as sent
    assert _headers(sent)[b"etag"] == b'"abc"'


@pytest.mark.parametrize("url, query", [
    ("/", ""),  # no trace named
    ("/problems", ""),
    ("/export", "trace={key}"),  # another page
    ("/home", ""),
    ("/dataset", "spikes=gate:0.05:16"),  # a calibrated gate needs the pair
    ("/", "trace=0123456789abcdef"),  # not in the store
    ("/", "trace=<script>alert(1)</script>"),
    ("/", "trace={key}&compare=abc@3"),  # colours shared with another trace: the live view's business
    ("/", "trace={key}&spikes=gate:0.05:16"),  # a calibrated gate needs the pair
])
def test_every_page_gets_the_page_rules_before_streamlits_script(stored, url, query):
    """A page without a first paint gets the shell with the page rules alone: right after React's root (a classic
    script: it runs before Streamlit's module script, which runs once the shell is parsed), fresh and whole."""
    _, trace = stored
    seen, sent = _get(url, query.format(key=trace.key))
    body = _body(sent)
    assert body == RULED and PAINT_ID not in body
    assert body.index('<div id="root"></div>') + len('<div id="root"></div>') == body.index("<script>")
    assert "history.replaceState" in body and "innerWidth < 1100" in body  # one entry per trace; a narrow window
    assert _headers(sent)[b"cache-control"] == b"no-store" and b"etag" not in _headers(sent)
    assert b"accept-encoding" not in dict(seen[0]["headers"])


def test_a_failing_build_serves_the_plain_shell(stored, monkeypatch):
    _, trace = stored

    def broken(*args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr(first_paint, "trace_paint", broken)
    _, sent = _get("/", f"trace={trace.key}")
    assert _body(sent) == RULED


def _figure_json(body: str) -> dict:
    """The figure a Dataset shell hands plotly.js (the object literal its module script draws)."""
    start = body.index("const fig = ") + len("const fig = ")
    return json.JSONDecoder().raw_decode(body[start:])[0]


def test_a_dataset_link_gets_the_pages_first_chart_in_the_shell(stored):
    """The first tab's figure over what a fresh page selects (here the stored trace), with the URL's metric and
    spike share, as the page draws it (app/dataset_panels.py), for the plotly.js of Streamlit's own Plotly chunk;
    the hostile trace's text cannot end the script early."""
    from core.analysis.registry import list_analyses

    path, trace = stored
    spec = list_analyses()[0]
    default_top = state.DEFAULTS["spike_top_pct"] / 100.0
    for query, score, top in (("", DEFAULT_SCORE, default_top), ("metric=entropy_base&spikes=top:5", "entropy_base", 0.05)):
        _, sent = _get("/dataset", query)
        body = _body(sent)
        assert body.count(f"id='{PAINT_ID}'") == 1 and body.index('<div id="root"></div>') < body.index(PAINT_ID)
        want = analysis_figure(spec, analysis_tables(spec.name, path, (trace.key,), score, top, None), {})
        assert _figure_json(body) == json.loads(want.to_json()), query
        script = body[body.index("const fig = "):body.index("</script>", body.index("const fig = "))]
        assert "<" not in script and f'new URL("{plotly_chunk()}", main ? main.src' in script
        assert _headers(sent)[b"cache-control"] == b"no-store"
    assert (STATIC_JS / plotly_chunk()).is_file()  # the chunk Streamlit's own charts load


def test_a_dataset_link_without_traces_gets_the_plain_shell(tmp_path, monkeypatch):
    monkeypatch.setattr(first_paint, "store_path", lambda: str(tmp_path))
    _, sent = _get("/dataset")
    assert _body(sent) == RULED
