"""Shared scaffolding for the browser tests: `streamlit run app/main.py` as a server, and a Playwright Chromium page.

Used by test_browser.py, test_journeys.py and test_notebook.py (the notebook widget's page).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.switchboard import CLICK_MODES
from core.cli.app import streamlit_command

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("FORKPOINT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
START_TIMEOUT_S = 120
# JS: `deep(selector)`, the first match in the page or inside a Streamlit component's shadow root (the token
# view is an isolated v2 component), for timing and watching scripts run with page.evaluate
# (the shadow root found is remembered: a scan of every component's subtree on each animation frame took a
# quarter of the page's main thread during a switch, which the timings then counted)
DEEP_JS = """const deep = (sel) => {
    const known = window.__fpDeepRoot;
    if (known && known.host && known.host.isConnected) return known.querySelector(sel) || document.querySelector(sel);
    for (const host of document.querySelectorAll("[data-testid^='stBidiComponent'], [data-testid^='stBidiComponent'] *")) {
      const hit = host.shadowRoot && host.shadowRoot.querySelector(sel);
      if (hit) { window.__fpDeepRoot = host.shadowRoot; return hit; }
    }
    return document.querySelector(sel);
  };"""
STEP_TIMEOUT_MS = 90_000
# the live token view's tokens (in the component's shadow root; Playwright's CSS pierces it): a shared trace link's
# shell shows the same tokens first, outside the component (app/first_paint.py), until the live view has drawn
LIVE_TOKENS = "[data-testid^='stBidiComponent'] .fp-scroll [data-pos]"


def require_chromium(hint: str = "") -> None:
    """Skip the test unless Chromium and Playwright are installed (`hint` is appended to the skip reason)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}{hint}")
    pytest.importorskip("playwright.sync_api")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"streamlit not healthy after {START_TIMEOUT_S}s:\n{log.read_text()[-3000:]}")


def pair_args(tmp_path_factory) -> list[str]:
    """The demo pair (the default: no arguments); a tiny random pair only while the demo is not built."""
    from core.demo.pair import DEMO_DIR

    if (DEMO_DIR / "pair.json").exists():
        return []
    from core.demo.tiny import build_tiny_pair

    base, reason = build_tiny_pair(tmp_path_factory.mktemp("browser_pair"))
    return ["--base", str(base), "--reason", str(reason), "--max-new-tokens", "48", "--device", "cpu"]


@contextmanager
def run_app(app_args: list[str], log: Path, env: Mapping[str, str] | None = None) -> Iterator[str]:
    """The app (app/main.py) with `app_args` on a free local port, served by `forkpoint app`'s command
    (core.cli.app.streamlit_command: st.App with the Host check and the switchboard's live route, the app's
    Streamlit settings as flags) and, as a user may start it, away from the checkout's root (in `log`'s folder, where
    Streamlit finds no .streamlit/config.toml of its own); output to `log`; yields the app's URL once healthy, and
    stops the server on exit. `env` is added to the environment."""
    port = free_port()
    with open(log, "w") as fh:
        proc = subprocess.Popen(streamlit_command("127.0.0.1", port, app_args), cwd=log.parent, stdout=fh,
                                stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    try:
        wait_healthy(port, proc, log)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def chromium_page(profile: Path, viewport: dict[str, int], timeout_ms: int = STEP_TIMEOUT_MS,
                  **context_options) -> Iterator:
    """A page of a headless Chromium with a persistent profile at `profile`; the browser closes on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, viewport=viewport,
            **context_options)
        try:
            context.add_init_script(RUN_WATCH)  # every page of the context (new tabs too): see settle()
            page = context.new_page()
            # what the page said, for a failing test's artifacts (tests/conftest.py): a blank page names its error
            page.console_log = []
            page.on("console", lambda m: page.console_log.append(
                f"console.{m.type}: {m.text}" + (f" ({m.location['url']})" if m.location.get("url") else "")))
            page.on("pageerror", lambda e: page.console_log.append(f"pageerror: {e}"))
            page.on("crash", lambda _: page.console_log.append("the page's renderer crashed"))
            page.on("requestfailed", lambda r: page.console_log.append(f"request failed: {r.method} {r.url}: {r.failure}"))
            page.on("framenavigated", lambda f: f == page.main_frame and page.console_log.append(f"navigated: {f.url}"))
            page.set_default_timeout(timeout_ms)
            yield page
        finally:
            context.close()


class SentElements(list):
    """What Streamlit's server sends a page while `on`: one `"kind:element id"` per element (a widget's or chart's id
    ends with its key: `plotly_chart:$$ID-…-score_plot`), decoded from the websocket's ForwardMsg protobufs. A message
    the browser already holds is resent by reference (`ref_hash`): named from the first time it came. Unlike watching
    the page for stale elements, this does not depend on how long a run takes. A context manager: enter it before the
    page opens its websocket (before `page.goto`)."""

    def __init__(self, page) -> None:
        super().__init__()
        self.on = False
        self._page = page
        self._named: dict[str, str] = {}

    def _socket(self, ws) -> None:
        ws.on("framereceived", self._frame)

    def __enter__(self) -> SentElements:
        self._page.on("websocket", self._socket)
        return self

    def __exit__(self, *exc) -> None:
        self.on = False
        self._page.remove_listener("websocket", self._socket)

    def _frame(self, payload) -> None:
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg  # deferred: only a test watching frames needs it

        if isinstance(payload, str):
            return
        msg = ForwardMsg()
        msg.ParseFromString(payload)
        kind = msg.WhichOneof("type")
        if kind == "ref_hash":
            name = self._named.get(msg.ref_hash, "?")
        elif kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
            element = msg.delta.new_element
            what = element.WhichOneof("type")
            name = f"{what}:{getattr(getattr(element, what), 'id', '')}"
            if msg.hash:
                self._named[msg.hash] = name
        else:
            return
        if self.on:
            self.append(name)

    def with_key(self, kind: str, key: str) -> list[str]:
        """The sent elements of `kind` whose id holds `key`."""
        return [name for name in self if name.startswith(f"{kind}:") and key in name]


# JS (an init script): what Streamlit's websocket carries, to tell when the app's runs are over (settle()).
# Each message is a protobuf with one field that says its kind: a BackMsg `rerun_script` (11) asks for a run, a ForwardMsg
# `new_session` (4) starts one (an app or fragment run), `script_finished` (6) ends one (its status 2,
# FINISHED_EARLY_FOR_RERUN, means another run follows). A run asked for is answered by the first run that starts after
# the ask and finishes: a run already going when the ask left (a fragment's, which a widget's ask does not cut short)
# may finish first, and its end says nothing about the ask.
RUN_WATCH = """(() => {
  const w = window.__fpRuns = { asked: 0, pending: false, started: false, finished: 0, last: performance.now(),
                                log: [] };  // the last 60 asks, starts and ends (a failing test's report shows them)
  const note = (what) => {
    w.log.push(`${(performance.now() / 1000).toFixed(2)} ${what}`);
    w.log.splice(0, w.log.length - 60);
  };
  const fields = (buf) => {  // a protobuf message's top-level fields: {number: varint value, or true}
    const b = new Uint8Array(buf), out = {}; let i = 0;
    const varint = () => { let v = 0, k = 0; while (i < b.length) { const c = b[i++]; v += (c & 127) * 2 ** k; k += 7;
      if (c < 128) break; } return v; };
    while (i < b.length) {
      const tag = varint(), type = tag & 7, field = Math.floor(tag / 8);
      if (type === 0) out[field] = varint();
      else if (type === 2) { const n = varint(); i += n; out[field] = true; }
      else if (type === 1) { i += 8; out[field] = true; }
      else if (type === 5) { i += 4; out[field] = true; }
      else break;  // groups: not in Streamlit's messages
    }
    return out;
  };
  const Native = window.WebSocket;
  class Watched extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener("message", (e) => {
        w.last = performance.now();
        if (!(e.data instanceof ArrayBuffer)) return;
        const msg = fields(e.data), status = msg[6];
        if (msg[4] !== undefined) { note("start"); if (w.pending) w.started = true; }
        if (status !== undefined) note(`end ${status}`);
        if (status !== undefined && status !== 2) {
          w.finished += 1;
          if (w.started) w.pending = w.started = false;
        }
      });
    }
    send(data) {
      w.last = performance.now();
      try {
        const buf = data instanceof ArrayBuffer ? data : ArrayBuffer.isView(data) ? data.buffer.slice(
          data.byteOffset, data.byteOffset + data.byteLength) : null;
        if (buf && fields(buf)[11] !== undefined) { w.asked += 1; w.pending = true; w.started = false; note("ask"); }
      } catch (err) { /* not a protobuf: not a run */ }
      return super.send(data);
    }
  }
  window.WebSocket = Watched;
})();"""
# JS: Streamlit's runs are over: the app has run on this page, every run asked for has finished, nothing is stale
# or running on screen, and the websocket has been quiet for QUIET_MS (a run the server starts itself, a rerun
# after a page switch, begins within that)
QUIET_MS = 300
SETTLED_JS = """(quiet) => {
  const w = window.__fpRuns;
  return !!w && w.finished > 0 && !w.pending && performance.now() - w.last >= quiet
    && !document.querySelector('[data-testid="stStatusWidget"], [data-stale="true"]')
    && ![...document.querySelectorAll('[data-testid="stToolbar"] button, header button')]
      .some((b) => /^(Stop|Running)/.test(b.innerText.trim()));
}"""


def settle(page, timeout_ms: int = STEP_TIMEOUT_MS) -> None:
    """Wait until Streamlit's runs are over (SETTLED_JS: every run the page asked for finished, nothing stale or
    running, the websocket quiet for QUIET_MS); for pages of chromium_page (its RUN_WATCH init script)."""
    page.wait_for_function(SETTLED_JS, arg=QUIET_MS, timeout=timeout_ms)


def click_mode(page, mode: str) -> None:
    """Choose what a click on a token does ("flip", "edit", "select": app/switchboard.py CLICK_MODES), wait until the
    page is settled, then check the token view has that mode (its data-mode, which its help line shows a reader):
    a click on a token before that does what the old mode says, and a click on the mode already chosen must keep
    it (it turned every mode off)."""
    page.get_by_text(CLICK_MODES[mode], exact=True).first.click()
    settle(page)
    page.locator(f'.fp-scroll[data-mode="{mode}"]').wait_for(timeout=10_000)


# JS: the page is drawn for a picture: fonts loaded, no skeleton, every shown data grid's canvas and every Plotly
# figure drawn (lazily loaded widgets draw after the run ends; a grid in a closed tab or expander draws when opened)
DRAWN_JS = """() => document.fonts.status === 'loaded' && !document.querySelector('[data-testid="stSkeleton"]')
  && [...document.querySelectorAll('[data-testid="stDataFrame"]')]
    .every((g) => !g.checkVisibility() || g.querySelector('canvas'))
  && [...document.querySelectorAll('.js-plotly-plot')].every((g) => g.querySelector('.main-svg'))"""


def drawn(page, timeout_ms: int = STEP_TIMEOUT_MS) -> None:
    """Wait until the page is settled and drawn for a screenshot (settle(), DRAWN_JS, then two frames painted)."""
    settle(page, timeout_ms)
    page.wait_for_function(DRAWN_JS, timeout=timeout_ms)
    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")


# JS: what is wrong with the layout of the main area: a control or label outside the window, a label cut
# (its text wider than its box; not a screen-reader-only element), a multiselect's chip or an empty input's
# placeholder cut, a label's word broken over two lines, or two controls' boxes overlapping (one cut by another).
# [] when nothing.
LAYOUT_JS = """() => {
    const main = document.querySelector('[data-testid="stMain"]');
    const W = window.innerWidth, out = [];
    const sel = 'button, input, [data-baseweb="select"], [data-testid="stMetric"], [data-testid="stWidgetLabel"],'
              + ' [data-testid="stMetricLabel"], [data-testid="stMetricValue"], [role="radiogroup"]';
    const shown = (e) => e.getClientRects().length && !e.closest('details:not([open])')
      && e.checkVisibility({ checkOpacity: true, checkVisibilityCSS: true });
    // clipped to nothing on purpose, for screen readers only (a radio's native input in React Aria's 1 px
    // VisuallyHidden span, which overflows it): no text of it is on screen to be cut
    const unseen = (t) => {
      for (let n = t; n && n !== main; n = n.parentElement) {
        const cs = getComputedStyle(n);
        if (cs.clipPath === 'inset(50%)' || cs.clip === 'rect(0px, 0px, 0px, 0px)') return true;
      }
      return false;
    };
    const els = [...main.querySelectorAll(sel)].filter(shown);
    const tables = [...main.querySelectorAll('table, [data-testid="stDataFrame"]')].filter(shown);  // inside the window too
    for (const e of [...els, ...tables]) {
      const r = e.getBoundingClientRect();
      const name = (e.innerText || e.getAttribute('aria-label') || e.tagName).trim().slice(0, 40);
      if (r.left < -0.5 || r.right > W + 0.5) out.push(`outside the window: ${name}`);
      // an input's text scrolls inside it by design (typed text, a long option); a table only has to sit in the window
      if (e.tagName === 'INPUT' || tables.includes(e)) continue;
      for (const t of [e, ...e.querySelectorAll('p, span, div')]) {
        if (t.scrollWidth > t.clientWidth + 1 && getComputedStyle(t).overflowX !== 'visible' && !unseen(t)) {
          out.push(`cut: ${name}`); break;
        }
      }
    }
    // a multiselect's chip shows its whole value (the row of chips scrolls by design, a chip's text is cut)
    for (const t of main.querySelectorAll('[data-tag] > span')) {
      if (shown(t) && t.scrollWidth > t.clientWidth + 1) out.push(`cut: chip ${t.innerText.trim().slice(0, 40)}`);
    }
    // an empty input's placeholder fits its box (its text is what the control says it is for)
    const ctx = document.createElement('canvas').getContext('2d');
    for (const t of main.querySelectorAll('input[placeholder]')) {
      if (!shown(t) || t.value || !t.placeholder) continue;
      const cs = getComputedStyle(t);
      ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
      const room = t.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
      if (ctx.measureText(t.placeholder).width > room + 1) out.push(`cut: placeholder ${t.placeholder.slice(0, 40)}`);
    }
    // a label's word on one line (a narrow column broke "temperature" into "temper" / "ature")
    for (const label of main.querySelectorAll('[data-testid="stWidgetLabel"]')) {
      if (!shown(label)) continue;
      const walk = document.createTreeWalker(label, NodeFilter.SHOW_TEXT);
      for (let node = walk.nextNode(); node; node = walk.nextNode()) {
        for (const m of node.data.matchAll(/\\S+/g)) {
          const r = document.createRange();
          r.setStart(node, m.index);
          r.setEnd(node, m.index + m[0].length);
          const lines = new Set([...r.getClientRects()].filter((q) => q.width > 0).map((q) => Math.round(q.top)));
          if (lines.size > 1) out.push(`broken: ${m[0].slice(0, 40)} (label ${label.innerText.trim().slice(0, 40)})`);
        }
      }
    }
    const boxes = [...main.querySelectorAll('[data-testid="stElementContainer"]')].filter((e) => shown(e)
      && e.querySelector(sel));
    for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
      const a = boxes[i], b = boxes[j];
      if (a.contains(b) || b.contains(a)) continue;
      const p = a.getBoundingClientRect(), q = b.getBoundingClientRect();
      const w = Math.min(p.right, q.right) - Math.max(p.left, q.left), h = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
      const what = (e) => `${(e.innerText || '').trim().slice(0, 30)}[${e.firstElementChild ? e.firstElementChild.dataset.testid : ''}]`;
      if (w > 1 && h > 1) out.push(`overlap: ${what(a)} / ${what(b)}`);
    }
    return [...new Set(out)];
  }"""


def layout_problems(page) -> list[str]:
    """The layout faults of the page as it is drawn now (LAYOUT_JS); [] when no control or label is cut."""
    return page.evaluate(LAYOUT_JS)
