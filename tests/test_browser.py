"""A real browser on the real app: Playwright drives Debian's chromium against `streamlit run app/main.py`.

Flow: first view on the demo pair -> hover a token (both top-k lists) -> click a spike -> n jumps to
the next spike -> the reasoning model takes over -> the branch appears beside the original with a
differing continuation -> export the trace as JSONL and read it back. Screenshots go to
test-output/browser/.
"""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest

from app.first_paint import PAINT_ID
from tests.browser import (LIVE_TOKENS, ROOT, chromium_page, click_mode, drawn, layout_problems, pair_args,
                           require_chromium, run_app, settle)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

OUT = ROOT / "test-output" / "browser"


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    require_chromium(" (.ci/run installs it)")
    OUT.mkdir(parents=True, exist_ok=True)
    store = tmp_path_factory.mktemp("browser_store")
    with run_app(["--store", str(store), *pair_args(tmp_path_factory)], OUT / "streamlit.log") as url:
        yield url, store


@pytest.fixture(scope="module")
def page(app_url, tmp_path_factory):
    profile = tmp_path_factory.mktemp("chromium_profile")
    with chromium_page(profile, viewport={"width": 1440, "height": 1600}, accept_downloads=True) as page:
        yield page


def _screenshot_page(page, path: Path, width: int = 1440) -> None:
    """The whole page in one picture: Streamlit scrolls inside its own container, so grow the viewport
    to the content's height, then clip to it."""
    page.mouse.move(0, 0)  # no hover card in the picture
    page.set_viewport_size({"width": width, "height": 3000})
    drawn(page)  # re-laid out at the new height
    box = page.locator('[data-testid="stMainBlockContainer"]').bounding_box()
    height = int(min(3000, box["y"] + box["height"] + 24)) if box else 3000
    page.screenshot(path=str(path), clip={"x": 0, "y": 0, "width": width, "height": height})
    page.set_viewport_size({"width": width, "height": 1600})


def _wait_selected(page, pos: int) -> None:
    """Wait until the selection panel shows token `pos` (exactly: #1 is not #15)."""
    page.get_by_text(re.compile(rf"^Token #{pos}$")).first.wait_for()


def _selected_pos(page) -> int:
    """The token number the selection panel shows ("Token #12 · emitted by ...")."""
    text = page.get_by_text(re.compile(r"Token #\d+")).first.inner_text()
    return int(re.search(r"Token #(\d+)", text).group(1))


def test_hover_click_take_over_and_export(app_url, page):
    url, store_dir = app_url
    page.goto(f"{url}?click=select&spikes=top:5")  # a click selects (the switchboard: tests/test_switchboard.py)
    page.get_by_role("button", name="Generate", exact=True).click()  # the empty store's first view: one action
    tokens = page.locator(".fp-scroll [data-pos]")
    tokens.first.wait_for()
    click_mode(page, "select")  # this walk selects; a flip opens a child (the switchboard)
    n = tokens.count()
    assert n > 5
    assert page.locator(".fp-scroll [data-pos].spike").count() >= 1  # spikes are outlined on the first view

    # hover: both models' top-k with probabilities
    tokens.nth(min(3, n - 1)).hover()
    card = page.locator(".fp-card")
    card.wait_for(state="visible")
    text = card.inner_text()
    assert "base top-" in text and "reason top-" in text and "Base entropy" in text and "KL(base‖reasoner)" in text
    assert re.search(r"\d\.\d+e-\d+|0\.\d+|1−", text)  # probabilities: 3 significant digits, never 0.000
    assert "0.000" not in text
    page.screenshot(path=str(OUT / "hover.png"))

    # click a spike: the selection panel follows, and the URL records it
    spikes = [int(p) for p in page.locator(".fp-scroll [data-pos].spike").evaluate_all(
        "els => els.map(e => e.dataset.pos)")]
    page.locator(f'.fp-scroll [data-pos="{spikes[0]}"]').click()
    _wait_selected(page, spikes[0])
    page.wait_for_function(f"() => window.location.search.includes('pos={spikes[0]}')")
    parent = re.search(r"trace=([0-9a-f]+)", page.url).group(1)

    # the score plot: clicking a point selects that token
    points = page.locator(".js-plotly-plot .scatterlayer .trace").first.locator(".points path")
    points.nth(2).wait_for(state="attached")
    points.nth(2).click(force=True)
    _wait_selected(page, 2)
    page.locator(f'.fp-scroll [data-pos="{spikes[0]}"]').click()
    _wait_selected(page, spikes[0])

    # keyboard: n / p jump to the next / previous spike
    if len(spikes) > 1:
        page.locator("body").press("n")
        _wait_selected(page, spikes[1])
        page.locator("body").press("p")
        _wait_selected(page, spikes[0])

    # choose a spike where the reasoner's favourite differs from the emitted token, so that the
    # takeover must change the continuation
    from core.io.store import TraceStore

    store = TraceStore(store_dir)
    trace = store.get(parent)
    differs = [p for p in spikes if int(trace.topk["reason"][0][p][0]) != int(trace.token_ids[p])]
    pos = differs[0] if differs else spikes[0]
    if pos != spikes[0]:
        page.locator(f'.fp-scroll [data-pos="{pos}"]').click()
        _wait_selected(page, pos)
    assert _selected_pos(page) == pos

    # take over: the branch appears beside the original, continuing differently (where the reasoner agrees
    # everywhere, a takeover changes nothing and core gives the parent back: force another token instead)
    page.get_by_role("button", name="Reasoning model takes over here" if differs else "Branch with this token").click()
    branch = page.locator('.fp-compare[data-side="branch"]')
    branch.wait_for()
    original = page.locator('.fp-compare[data-side="original"]')
    assert page.get_by_text(f"Branch at token #{pos}").first.is_visible()
    if differs:
        assert page.get_by_text(f"First difference at #{pos}").first.is_visible()
        assert branch.inner_text() != original.inner_text()
    _screenshot_page(page, OUT / "trace.png")  # the README's screenshot (copied to assets/screenshot.png)

    # the branch is stored as a child of the open trace
    kids = store.children(parent)
    assert len(kids) == 1 and store.get(kids[0]).meta["branch_pos"] == pos

    # export the open trace as JSONL and read it back
    page.get_by_role("link", name="Export").click()
    button = page.get_by_role("button", name=re.compile(r"Download forkpoint-.*\.jsonl"))
    button.wait_for()
    with page.expect_download() as info:
        button.click()
    saved = OUT / info.value.suggested_filename
    info.value.save_as(saved)
    from core.views.exports import read_jsonl

    traces = read_jsonl(saved)
    from core.views.exports import annotated

    # lossless, plus the annotations the user saw (the sidebar's top 5% spikes, planning tags)
    assert [t.key for t in traces] == [parent] and traces[0] == annotated(store.get(parent), top=0.05)
    page.screenshot(path=str(OUT / "export.png"))


def test_copied_link_reopens_the_view(app_url, page):
    url, store_dir = app_url
    from core.io.store import TraceStore

    keys = [k for k in TraceStore(store_dir).keys()]
    if not keys:
        pytest.skip("needs the trace made by the first test")
    key = TraceStore(store_dir).summaries().iloc[0]["key"]
    page.goto(f"{url}trace?trace={key}&pos=1&click=select")
    _wait_selected(page, 1)
    page.locator('.fp-scroll [data-pos="1"].sel').wait_for()  # the component marks the linked token
    assert page.locator(".fp-scroll .tok.sel").count() == 1
    assert "no corresponding file" not in page.locator("body").inner_text()  # /trace is a page: no "Page not found"


# JS (an init script): whether Streamlit's "Page not found" dialog showed at any time (it says so, then runs the main
# page, and stays until closed)
NOT_FOUND_WATCH = """
window.__fpNotFound = false;
new MutationObserver(() => {
  if (document.body && document.body.textContent.includes('Page not found')) window.__fpNotFound = true;
}).observe(document, { childList: true, subtree: true, characterData: true });
"""


def test_every_page_opens_from_its_url_in_a_fresh_browser(app_url, page):
    """Issue 31: a shared link opens its page in a new browser session (a new tab: a Streamlit session that never
    saw the app): the Export page exporting the trace the URL names, the Trace page at /trace and at /home (the
    default page's declared path, which Streamlit does not serve: "Page not found", then the trace)."""
    url, store_dir = app_url
    from core.io.store import TraceStore

    rows = TraceStore(store_dir).summaries()
    if rows.empty:
        pytest.skip("needs the trace made by the first test")
    key = rows.iloc[0]["key"]
    fresh = page.context.new_page()  # the module's browser (one sync Playwright per process)
    try:
        fresh.goto(f"{url}export?trace={key}")
        fresh.get_by_text(key, exact=True).first.wait_for()  # the caption "Trace `key`"
        fresh.get_by_role("button", name=re.compile(rf"Download forkpoint-{key[:8]}.*\.jsonl")).wait_for()
        assert "No trace is open" not in fresh.locator("body").inner_text()
        fresh.add_init_script(NOT_FOUND_WATCH)
        for path in ("trace", "home"):  # another fresh session each, by the Trace page's hidden paths
            fresh.goto(f"{url}{path}?trace={key}")
            fresh.locator(f'.fp-scroll[data-key="{key}"] [data-pos]').first.wait_for()
            settle(fresh)
            assert not fresh.evaluate("window.__fpNotFound"), path  # no "Page not found" at any time
            assert fresh.url.startswith(f"{url}{path}?"), fresh.url
    finally:
        fresh.close()



# JS (an init script): every frame, whether the shell's first paint (app/first_paint.py) and the live token view
# (its tokens in the component's shadow root) are on screen, and the first paint's token texts as last painted (a
# frame can come while the parser is still inside the paint's element: its first frame may hold no token yet)
PAINT_WATCH = """
window.__fpPaint = { seen: false, texts: null, both: 0, liveSeen: false };
const liveTokens = () => {
  for (const h of document.querySelectorAll("[data-testid^='stBidiComponent'], [data-testid^='stBidiComponent'] *")) {
    const hit = h.shadowRoot && h.shadowRoot.querySelectorAll('.fp-scroll [data-pos]');
    if (hit && hit.length) return hit;
  }
  return null;
};
const tick = () => {
  const w = window.__fpPaint, paint = document.getElementById('fp-first-paint'), live = liveTokens();
  if (paint) { w.seen = true; w.texts = [...paint.querySelectorAll('[data-pos]')].map((e) => e.textContent); }
  if (live) w.liveSeen = true;
  if (paint && live) w.both += 1;
  requestAnimationFrame(tick);
};
requestAnimationFrame(tick);
"""


def test_a_shared_trace_link_shows_its_text_before_the_live_view_and_never_both(app_url, page):
    """Issue 31: a shared trace link's shell carries the trace's tokens outside React's root (app/first_paint.py);
    the live token view replaces them: the same texts, the first paint gone once it draws, never both painted."""
    url, store_dir = app_url
    trace = _stored_trace(store_dir)
    fresh = page.context.new_page()
    try:
        fresh.add_init_script(PAINT_WATCH)
        fresh.goto(f"{url}trace?trace={trace.key}")
        fresh.locator(f'.fp-scroll[data-key="{trace.key}"] [data-pos]').first.wait_for()  # the live view
        fresh.wait_for_timeout(500)
        watched = fresh.evaluate("window.__fpPaint")
        assert watched["seen"] and watched["liveSeen"]
        assert fresh.locator("#fp-first-paint").count() == 0  # gone
        assert fresh.evaluate("window.__fpFirstPaintGone") == "live"  # because the live view drew, not an error
        assert watched["both"] == 0  # never a double view
        live = fresh.locator(LIVE_TOKENS).all_text_contents()
        assert watched["texts"] == live and len(live) == len(trace)  # the same tokens, in order
    finally:
        fresh.close()


# JS (an init script): where a Dataset link's first chart (app/first_paint.py) and Streamlit's own chart were drawn (seen
# by a mutation observer: the paint may go before a frame shows it), and in how many frames both were on screen
DATASET_WATCH = """
window.__fpDataset = { paint: null, live: null, both: 0 };
const box = (e) => { const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; };
const look = () => {
  const w = window.__fpDataset;
  const paint = document.querySelector('#fp-first-paint .main-svg');
  const live = document.querySelector('[data-testid="stMain"] .js-plotly-plot .main-svg');
  if (paint) w.paint = box(paint);
  if (live) w.live = box(live);
  return paint && live;
};
new MutationObserver(look).observe(document, { childList: true, subtree: true });
const tick = () => { if (look()) window.__fpDataset.both += 1; requestAnimationFrame(tick); };
requestAnimationFrame(tick);
"""


@pytest.mark.parametrize("width", [1440, 800])
def test_a_dataset_link_draws_its_first_chart_before_streamlit_and_never_both(app_url, page, width):
    """Issue 31: a Dataset link's shell draws the first tab's chart with the plotly.js of Streamlit's own Plotly
    chunk (app/first_paint.py), where Streamlit will draw it (beside the sidebar; at 800 px, where the shell closes
    the sidebar, at the window's left); Streamlit's chart replaces it, never both on screen."""
    url, store_dir = app_url
    _stored_trace(store_dir)
    # a shell whose chart takes over DATASET_TIMEOUT_S to build comes plain (the build goes on and caches the
    # analysis): ask until one comes with it, so that a loaded machine does not decide what this test sees
    for _ in range(10):
        if f"id='{PAINT_ID}'" in urllib.request.urlopen(f"{url}dataset", timeout=60).read().decode():
            break
        time.sleep(1)
    else:
        pytest.fail("no Dataset shell came with its first chart in 10 tries")
    fresh = page.context.new_page()
    try:
        fresh.set_viewport_size({"width": width, "height": 1600})
        fresh.add_init_script(DATASET_WATCH)
        fresh.goto(f"{url}dataset")
        fresh.locator('[data-testid="stMain"] .js-plotly-plot .main-svg').first.wait_for()
        fresh.wait_for_timeout(500)
        watched = fresh.evaluate("window.__fpDataset")
        assert watched["paint"] is not None and watched["live"] is not None
        assert watched["both"] == 0  # never two charts
        assert fresh.locator("#fp-first-paint").count() == 0
        assert fresh.evaluate("window.__fpFirstPaintGone") == "live"  # because Streamlit's chart drew
        assert all(abs(a - b) <= 4 for a, b in zip(watched["paint"], watched["live"])), watched  # in its place
    finally:
        fresh.close()


# JS (an init script): in the first frame that shows the live token view, how many Plotly charts the page has
CHART_WATCH = """
window.__fpCharts = null;
const tick = () => {
  const live = [...document.querySelectorAll("[data-testid^='stBidiComponent'], [data-testid^='stBidiComponent'] *")]
    .some((h) => h.shadowRoot && h.shadowRoot.querySelector('.fp-scroll [data-pos]'));
  if (live) { window.__fpCharts = document.querySelectorAll('[data-testid="stPlotlyChart"], .js-plotly-plot').length; return; }
  requestAnimationFrame(tick);
};
requestAnimationFrame(tick);
"""


def test_a_fresh_session_draws_its_charts_after_the_text(app_url, page):
    """A new session's Trace page sends no Plotly chart until its token view has drawn and said so (in a fresh
    browser, Plotly's bundle held the token view's script back by seconds); then the score plot follows. The
    token view's own script is held back 1.5 s here, so a chart sent with the text would be on screen first."""
    url, store_dir = app_url
    trace = _stored_trace(store_dir)
    fresh = page.context.new_page()  # a new tab: a new Streamlit session

    def late(route):
        time.sleep(1.5)
        route.continue_()

    try:
        fresh.route("**/BidiComponent*.js", late)
        fresh.add_init_script(CHART_WATCH)
        fresh.goto(f"{url}?trace={trace.key}")
        fresh.locator(f'.fp-scroll[data-key="{trace.key}"] [data-pos]').first.wait_for()
        fresh.wait_for_function("() => window.__fpCharts !== null")
        assert fresh.evaluate("window.__fpCharts") == 0  # no chart before the text
        fresh.locator('[class*="st-key-score_plot"] .js-plotly-plot').wait_for()  # the score plot follows
    finally:
        fresh.close()


def _stored_trace(store_dir):
    from core.io.store import TraceStore

    rows = TraceStore(store_dir).summaries()
    if rows.empty:
        pytest.skip("needs the trace made by the first test")
    roots = rows[rows["parent"].fillna("") == ""]  # the first test's own trace, not its branch
    return TraceStore(store_dir).get(str((roots if not roots.empty else rows).iloc[0]["key"]))


def test_up_down_move_the_cursor_a_line_and_space_flips(app_url, page):
    """Issue 31's keyboard: ↑ ↓ move the token cursor to the nearest token one line up / down; Space flips at
    the cursor (a new trace, or the "nothing changes" line where the reasoner writes the same token)."""
    url, store_dir = app_url
    from core.io.store import TraceStore
    from core.views.presentation import flip_changes

    trace = _stored_trace(store_dir)
    page.set_viewport_size({"width": 900, "height": 1400})  # a narrow column: the text takes several lines
    try:
        page.goto(f"{url}?trace={trace.key}&click=flip")
        page.locator(f'.fp-scroll[data-key="{trace.key}"] [data-pos]').first.wait_for()
        drawn(page)  # laid out: the lines' tops are final
        tops = page.locator(".fp-scroll [data-pos]").evaluate_all("els => els.map(e => e.getBoundingClientRect().top)")
        if len({round(t) for t in tops}) < 2:
            pytest.skip("the text fits on one line")
        body = page.locator("body")
        body.press("ArrowRight")  # the cursor appears on the first token
        cursor = page.locator(".fp-scroll .tok.cur")
        cursor.wait_for()
        box = lambda: cursor.evaluate("e => [e.getBoundingClientRect().top, e.getBoundingClientRect().bottom, Number(e.dataset.pos)]")  # noqa: E731
        top0, bottom0, pos0 = box()
        body.press("ArrowDown")
        top1, _, pos1 = box()
        assert top1 >= bottom0 - 2 and pos1 > pos0, (top0, top1, pos0, pos1)  # one line down, later in the text
        body.press("ArrowUp")
        top2, _, pos2 = box()
        assert abs(top2 - top0) < 2 and pos2 <= pos1, (top0, top2)  # back on the first line
        assert _key(page) == trace.key  # moving only moves
        points = flip_changes(trace)
        target = points[0] if points else 1
        while box()[2] != target:  # walk the cursor to a token where a flip changes the text
            body.press("ArrowRight" if box()[2] < target else "ArrowLeft")
        scrolled = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollTop")
        body.press(" ")
        if points:
            page.wait_for_function("(k) => !window.location.search.includes('trace=' + k)", arg=trace.key)
            child = TraceStore(store_dir).get(_key(page))
            assert child.meta["parent"] == trace.key and str(target) in child.meta["switches"]
        else:
            page.locator(".fp-note").wait_for(state="visible")
        assert page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollTop") <= scrolled + 40
    finally:
        page.set_viewport_size({"width": 1440, "height": 1600})


def test_at_1440px_no_control_is_cut(app_url, page):
    """The Trace page at 1440 px with the sidebar open: no control or label is cut by the window or another element
    (the check of tests/test_switchboard.py at 800 px, tests/browser.layout_problems; every page:
    tests/test_journeys.py)."""
    url, store_dir = app_url
    trace = _stored_trace(store_dir)
    page.set_viewport_size({"width": 1440, "height": 1600})
    page.goto(f"{url}?trace={trace.key}")
    page.locator(f'.fp-scroll[data-key="{trace.key}"] [data-pos]').first.wait_for()
    drawn(page)  # the runs over, grids, figures and fonts drawn
    # open, though the 900 px test before closed it (app/first_paint.py PAGE_JS: a narrow window's close is not kept)
    assert page.locator('[data-testid="stSidebar"]').get_attribute("data-collapsed") == "false"
    problems = layout_problems(page)
    page.screenshot(path=str(OUT / "wide_1440.png"))
    assert problems == [], problems


# a main area with what the layout check must flag (a cut label, a chip cut to "bas…", a placeholder cut to
# "Choose op", a label's word broken over two lines) and what it must not: a radio group's native input in React
# Aria's 1 px screen-reader-only span (Streamlit's st.radio), which overflows that span on every page with a radio group
LAYOUT_PAGE = """<html><body style="font: 14px sans-serif; width: 700px"><div data-testid="stMain">
<div role="radiogroup"><label><span style="border: 0; clip: rect(0px, 0px, 0px, 0px); clip-path: inset(50%);
  height: 1px; margin: -1px; overflow: hidden; padding: 0; position: absolute; width: 1px; white-space: nowrap"><input
  type="radio" name="mode" checked></span><span>choose from the set</span></label></div>
<div data-testid="stWidgetLabel" style="width: 40px"><p style="overflow: hidden; white-space: nowrap;
  text-overflow: ellipsis">Spikes only</p></div>
<span data-tag><span style="display: inline-block; max-width: 30px; overflow: hidden; white-space: nowrap;
  text-overflow: ellipsis">base_only</span></span>
<input placeholder="Choose options" style="width: 60px; padding: 0 8px">
<div data-testid="stWidgetLabel" style="width: 40px; overflow-wrap: anywhere"><p>temperature</p></div>
<div data-testid="stWidgetLabel" style="width: 60px"><p>max new tokens</p></div>
</div></body></html>"""


def test_the_layout_check_flags_cut_text_and_not_a_screen_reader_only_input(page, tmp_path):
    """tests/browser.LAYOUT_JS on a page of known faults: each cut is named once, nothing else (a radio group's
    hidden native input was "cut: choose from the set" on the Generate, Export and Dataset pages); words wrapped
    whole onto lines of their own are no fault."""
    page_file = tmp_path / "layout.html"
    page_file.write_text(LAYOUT_PAGE, encoding="utf-8")
    static = page.context.new_page()  # the module's browser (one sync Playwright per process)
    try:
        static.goto(page_file.as_uri())
        found = layout_problems(static)
    finally:
        static.close()
    assert found == ["cut: Spikes only", "cut: chip base_only", "cut: placeholder Choose options",
                     "broken: temperature (label temperature)"]


def _key(page) -> str:
    return re.search(r"trace=([0-9a-f]+)", page.url).group(1)


def test_arabic_stays_joined_across_token_spans(page, tmp_path):
    """Issue 22 defect 9: Arabic letters drew unjoined in the heatmap while the prompt header shaped them. An
    empty byte piece (padded to stay clickable) sat between two letters; joined text is as wide as plain text."""
    import numpy as np

    from core.trace import Trace
    from core.views.heatmap import heatmap_css, tokens_html
    from tests.fakes import make_trace

    tokens = ["مر", "", "حب", "ا", " بال", "", "عا", "لم", " الج", "", "ميل"]
    base = make_trace(len(tokens), seed=1)
    trace = Trace(token_ids=base.token_ids, tokens=tokens, prompt_ids=base.prompt_ids, metrics=base.metrics,
                  topk=base.topk, source=np.array(["base"] * len(tokens), dtype=object), meta=base.meta)
    page_file = tmp_path / "arabic.html"
    page_file.write_text(
        f"<html><head><meta charset=utf-8><style>{heatmap_css()}</style></head><body>"
        f"<div id=a style='display:inline-block'>{tokens_html(trace, tips=False, css_tips=False, spikes=[])}</div><br>"
        f"<div id=b class=fp-heatmap style='display:inline-block'>{''.join(tokens)}</div></body></html>", encoding="utf-8")
    static = page.context.new_page()  # the module's browser (one sync Playwright per process)
    try:
        static.goto(page_file.as_uri())
        heat = static.evaluate("document.querySelector('#a .fp-heatmap').getBoundingClientRect().width")
        plain = static.evaluate("document.getElementById('b').getBoundingClientRect().width")
        static.screenshot(path=str(OUT / "arabic.png"))
    finally:
        static.close()
    assert abs(heat - plain) < 1.0, (heat, plain)
