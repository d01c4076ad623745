"""The three journeys a user takes, end to end in a real Chromium (Playwright) against `streamlit run app/main.py`:
browse heatmaps (every page, every link and programmatic navigation), take over / force / branch a branch,
and export each format and read the file back checking the annotation columns. No page may show an error.
Screenshots of each page go to test-output/journeys/.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.browser import (
    LIVE_TOKENS,
    ROOT,
    chromium_page,
    click_mode,
    drawn,
    layout_problems,
    pair_args,
    require_chromium,
    run_app,
    settle,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

OUT = ROOT / "test-output" / "journeys"
PAGES = ["Trace", "Problems", "Generate", "Dataset", "Compare", "Export", "About"]  # app/main.py PAGES
ERROR_BOXES = '[data-testid="stException"], [data-testid="stAlertContentError"]'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    require_chromium()
    OUT.mkdir(parents=True, exist_ok=True)
    store = tmp_path_factory.mktemp("journey_store")
    log = OUT / "streamlit.log"
    with run_app(["--store", str(store), *pair_args(tmp_path_factory)], log, env={"OMP_NUM_THREADS": "1"}) as url:
        yield url, store, log


@pytest.fixture(scope="module")
def page(server, tmp_path_factory):
    profile = tmp_path_factory.mktemp("journey_profile")
    with chromium_page(profile, viewport={"width": 1440, "height": 2200}, accept_downloads=True) as pg:
        pg.bad_responses = []
        pg.on("response", lambda r: pg.bad_responses.append(r.url) if r.status >= 400 else None)
        yield pg


def _no_error(page, where: str, log: Path) -> None:
    boxes = page.locator(ERROR_BOXES)
    texts = [boxes.nth(i).inner_text() for i in range(boxes.count())]
    assert not texts, f"{where}: error box(es) {texts}\nserver log tail:\n{log.read_text()[-2000:]}"


def _shot(page, name: str) -> None:
    page.mouse.move(0, 0)
    drawn(page)  # lazily loaded widgets (data grids, figures) draw after the run ends
    page.screenshot(path=str(OUT / f"{name}.png"), full_page=True)


def _nav(page, title: str) -> None:
    page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name=title).first.click()
    settle(page)


def _wait_trace(page) -> None:
    """Wait for the token view; on an empty store's first view (no trace yet: nothing is generated unasked) make
    the first trace the way a user does, with the empty state's Generate."""
    tokens = page.locator(LIVE_TOKENS).first  # the live view, not a shared link's first paint (app/first_paint.py)
    generate = page.get_by_role("button", name="Generate", exact=True)
    tokens.or_(generate).first.wait_for()
    if not tokens.is_visible() and generate.is_visible():
        generate.click()
    try:
        tokens.wait_for()
    except PlaywrightTimeout:  # a rare CI failure (a trace open, no token view): keep what the page showed
        page.screenshot(path=str(OUT / "wait_trace_timeout.png"), full_page=True)
        shown = page.locator('[data-testid="stMain"]').inner_text()[:3000]
        hosts = page.locator("[data-testid^='stBidiComponent']").count()
        raise AssertionError(f"no token view at {page.url} ({hosts} component host(s)); the page showed:\n{shown}")
    settle(page)


def _select(page, pos: int) -> None:
    page.locator(f'.fp-scroll [data-pos="{pos}"]').click()
    page.get_by_text(re.compile(rf"^Token #{pos}$")).first.wait_for()
    settle(page)


def _click_first_grid_row(page, testid_key: str) -> None:
    """Tick the first row of a selectable st.dataframe (its row-marker column sits at the far left)."""
    grid = page.locator(f'.st-key-{testid_key} [data-testid="stDataFrame"]').first
    grid.wait_for()
    box = grid.bounding_box()
    page.mouse.click(box["x"] + 18, box["y"] + 35 + 17)


def test_every_page_from_every_link_without_an_error(server, page):
    listed = re.findall(r'\("[a-z_]+\.py", "([^"]+)"', (ROOT / "app" / "main.py").read_text())
    assert listed == PAGES, "the journey must visit every page the app lists"
    url, _, log = server
    page.goto(url)
    _wait_trace(page)
    for title in PAGES:
        _nav(page, title)
        _no_error(page, title, log)
        _shot(page, title.lower())
    page.goto(f"{url}problems")  # a deep link to another page
    settle(page)
    _no_error(page, "deep link /problems", log)


SIDEBAR = '[data-testid="stSidebar"]'


def _page_paths() -> list[str]:
    """Each page's URL path, in PAGES' order (app/main.py PAGES; the Trace page is the default page, at "/")."""
    listed = re.findall(r'\("[a-z_]+\.py", "[^"]+", "[^"]+", "([a-z_]+)"\)', (ROOT / "app" / "main.py").read_text())
    assert len(listed) == len(PAGES), listed
    return ["", *listed[1:]]


def test_at_800px_every_page_closes_the_sidebar_and_cuts_nothing_and_at_1440px_opens_it(server, page):
    """At 800 px every page opens with the sidebar closed (one rule in every page's shell: app/first_paint.py
    PAGE_JS; only the Trace page's token view closed it, so a fresh browser on Problems, Generate or Dataset found it
    open and their controls squeezed: "Correct" 46 px wide, chips "bas…", "temper/ature") and no control, label, chip
    or placeholder cut (tests/browser.layout_problems), the Problems page's Search tab too. At 1440 px, in the same
    browser, the sidebar opens again (the narrow window's close is not kept: one rule for every page, so two pages
    are checked there, the widest controls' and the Trace page) and nothing is cut. A user who opens it on a narrow
    window keeps it open on the next page."""
    url, _, _ = server
    page.goto(url)
    _wait_trace(page)  # a trace for the pages that show one
    page.evaluate("() => localStorage.clear()")  # no sidebar state kept from earlier tests
    found: dict[tuple[int, str], tuple[str | None, list[str]]] = {}
    pages = list(zip(PAGES, _page_paths()))
    try:
        for width in (800, 1440):
            page.set_viewport_size({"width": width, "height": 1400})
            for title, path in pages[1:] + pages[:1]:  # the Trace page last: it closed the sidebar for the others
                if width == 1440 and title not in ("Generate", "Trace"):
                    continue
                page.goto(url + path)
                drawn(page)
                found[width, title] = page.locator(SIDEBAR).get_attribute("data-collapsed"), layout_problems(page)
                page.screenshot(path=str(OUT / f"{title.lower()}_{width}.png"))
                if title == "Problems":
                    page.get_by_role("tab", name="Search").click()
                    drawn(page)
                    found[width, "Problems: Search"] = (page.locator(SIDEBAR).get_attribute("data-collapsed"),
                                                        layout_problems(page))
        page.set_viewport_size({"width": 800, "height": 1400})
        page.goto(f"{url}problems")
        page.wait_for_function(f"() => document.querySelector('{SIDEBAR}')?.dataset.collapsed === 'true'")
        page.locator('[data-testid="stExpandSidebarButton"]').click()  # the user opens it
        page.wait_for_function(f"() => document.querySelector('{SIDEBAR}')?.dataset.collapsed === 'false'")
        _nav(page, "About")
        page.wait_for_timeout(500)
        found[800, "opened, then About"] = page.locator(SIDEBAR).get_attribute("data-collapsed"), []
    finally:
        page.set_viewport_size({"width": 1440, "height": 2200})
    want = {(w, t): ("true" if w == 800 and not t.startswith("opened") else "false", []) for w, t in found}
    assert found == want


@pytest.mark.xfail(strict=True, reason="Streamlit's frontend probes <page>/_stcore/{health,host-config} to find "
                   "its base path before falling back to /_stcore (404s in the log; the page works). Not fixed.")
def test_deep_link_logs_no_404(server, page):
    url, _, _ = server
    page.bad_responses.clear()
    page.goto(f"{url}problems")
    settle(page)
    assert not [u for u in page.bad_responses if "_stcore" in u], page.bad_responses


def test_open_a_trace_from_the_problems_table(server, page):
    url, store, log = server
    page.goto(url)
    _wait_trace(page)
    _nav(page, "Problems")
    _click_first_grid_row(page, "problems_traces")
    _wait_trace(page)  # lands on the Trace page with the chosen trace, no KeyError ("score")
    _no_error(page, "Problems -> Trace", log)
    assert "trace=" in page.url
    for title in PAGES[:3]:  # every page still works after the programmatic switch
        _nav(page, title)
        _no_error(page, f"{title} after opening from Problems", log)


def test_open_a_trace_from_generate(server, page):
    url, store, log = server
    page.goto(url)
    _wait_trace(page)
    _nav(page, "Generate")
    page.get_by_role("button", name=re.compile(r"^Run on \d+ problem")).click()
    page.get_by_text(re.compile(r"trace\(s\) stored")).first.wait_for()
    settle(page)
    page.get_by_role("button", name="Open in Trace").click()
    _wait_trace(page)
    _no_error(page, "Generate -> Trace", log)


def _wait_for(cond, timeout_s: float = 90.0) -> None:
    import time

    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.2)


def _bg(page, selector: str) -> str:
    return page.locator(selector).first.evaluate("e => getComputedStyle(e).backgroundColor")


def test_take_over_force_and_branch_a_branch_with_one_colour_scale(server, page):
    from core.io.store import TraceStore

    url, store_dir, log = server
    page.goto(f"{url}?click=select&spikes=top:5")  # a click selects (the switchboard is tests/test_switchboard.py)
    _wait_trace(page)
    click_mode(page, "select")  # a click selects here (flip mode opens a child)
    parent = re.search(r"trace=([0-9a-f]+)", page.url).group(1)
    store = TraceStore(store_dir)
    trace = store.get(parent)
    # a switch point (the reasoner writes another token) when the trace has one; else the takeover changes
    # nothing (core gives the parent back, the page says so) and the forced token below makes the first branch
    pos = next((p for p in range(1, len(trace)) if int(trace.topk["reason"][0][p][0]) != int(trace.token_ids[p])), 1)
    differs = int(trace.topk["reason"][0][pos][0]) != int(trace.token_ids[pos])
    _select(page, pos)
    page.get_by_role("button", name="Reasoning model takes over here").click()
    if not differs:
        page.get_by_text(re.compile(r"here too: nothing changes")).first.wait_for()
        page.get_by_role("button", name="Branch with this token").click()
    page.locator('.fp-compare[data-side="branch"]').wait_for()
    settle(page)
    _no_error(page, "take over", log)
    # the same token has the same colour in the main view and in the comparison (one shared range)
    n = len(trace)
    checked = 0
    for i in range(pos, min(n, pos + 12)):
        main = _bg(page, f'.fp-scroll [data-pos="{i}"]')
        side = _bg(page, f'.fp-compare[data-side="original"] [data-pos="{i}"]')
        assert main == side, (i, main, side)
        checked += 1
    assert checked >= 2
    _shot(page, "takeover")
    # force a token from the top-k (done above already where the takeover changed nothing)
    if differs:
        page.get_by_role("button", name="Branch with this token").click()
    _wait_for(lambda: len(TraceStore(store_dir).children(parent)) >= 1 + differs)
    settle(page)
    _no_error(page, "force a token", log)
    kids = [store.get(k) for k in TraceStore(store_dir).children(parent)]
    assert any(str(k.source[pos]) == "forced" for k in kids)
    assert any(str(k.source[pos]) == "reason" for k in kids) == differs
    # branch the branch: open it, take over later on
    page.get_by_role("button", name="Open the branch").click()
    page.wait_for_function(f"() => !window.location.search.includes('trace={parent}')")
    _wait_trace(page)
    child = re.search(r"trace=([0-9a-f]+)", page.url).group(1)
    assert child != parent
    later = min(pos + 3, len(TraceStore(store_dir).get(child)) - 1)
    _select(page, later)
    page.get_by_role("button", name="Branch with this token").click()  # another token: always a new branch
    page.locator('.fp-compare[data-side="branch"]').wait_for()
    _wait_for(lambda: bool(TraceStore(store_dir).children(child)))
    settle(page)
    _no_error(page, "branch a branch", log)
    assert TraceStore(store_dir).children(child), "the branch of a branch is stored under the branch"
    edges = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].flatMap(gd => (gd.data || [])
        .filter(t => t.mode === 'text').flatMap(t => Array.from(t.hovertext || [])))""")
    assert len([e for e in edges if re.search(r"(forced|reasoner) '", e)]) >= 2, edges  # each edge names its switch
    _shot(page, "branch_of_branch")


def _download(page, fmt_label: str, tmp: Path, ext: str) -> Path:
    page.get_by_text(fmt_label, exact=True).first.click()
    settle(page)
    button = page.get_by_role("button", name=re.compile(rf"Download forkpoint-.*\.{ext}$"))  # this format's file
    button.wait_for()
    with page.expect_download() as info:
        button.click()
    out = tmp / info.value.suggested_filename
    info.value.save_as(out)
    return out


def test_export_each_format_carries_the_annotations(server, page, tmp_path):
    url, store_dir, log = server
    page.goto(f"{url}?spikes=top:5")  # the annotations the user sees travel with every format
    _wait_trace(page)
    _nav(page, "Export")
    jsonl = _download(page, "JSONL (lossless)", tmp_path, "jsonl")
    record = json.loads(jsonl.read_text(encoding="utf-8").splitlines()[0])
    n = len(record["token_ids"])
    assert len(record["spike"]) == n and len(record["tag"]) == n and any(record["spike"])
    assert record["annotations"]["spikes"]["rule"]["top"] == pytest.approx(0.05)
    assert sorted(i for i, s in enumerate(record["spike"]) if s) == record["annotations"]["spikes"]["positions"]
    assert all(isinstance(t, str) and not t.startswith("#") for t in record["topk"]["base"]["tokens"][0])
    csv_zip = _download(page, "CSV (+ record, zipped)", tmp_path, "zip")
    with zipfile.ZipFile(csv_zip) as zf:
        name = next(x for x in zf.namelist() if x.endswith(".csv"))
        frame = pd.read_csv(io.BytesIO(zf.read(name)), keep_default_na=False)
    assert {"spike", "tag", "topk_base_tokens", "topk_reason_probs"} <= set(frame.columns)
    assert frame["spike"].astype(str).isin(["True"]).sum() == sum(record["spike"])
    parquet = _download(page, "Parquet", tmp_path, "parquet")
    pq_frame = pd.read_parquet(parquet)
    assert pq_frame["spike"].sum() == sum(record["spike"]) and list(pq_frame["tag"]) == record["tag"]
    html_file = _download(page, "HTML (self-contained)", tmp_path, "html")
    text = html_file.read_text(encoding="utf-8")
    outlined = [int(p) for p in re.findall(r'class="tok[^"]*\bspike\b[^"]*" data-pos="(\d+)"', text)]
    assert sorted(outlined) == record["annotations"]["spikes"]["positions"]  # the legend's swatch is not a token
    assert "spike rule</td><td>none" not in text and "top 5% by" in text
    _no_error(page, "export", log)
    _shot(page, "export")


NODE_XY_JS = """(key) => {
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    for (const tr of gd.data || []) {
      const i = Array.from(tr.customdata || []).indexOf(key);
      if (i < 0 || typeof key !== 'string') continue;
      const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, r = gd.getBoundingClientRect();
      return [r.left + xa._offset + xa.l2p(tr.x[i]), r.top + ya._offset + ya.l2p(tr.y[i])];
    }
  }
  return null;
}"""


def _local(url: str) -> bool:
    return url.startswith(("http://127.0.0.1", "http://localhost", "ws://127.0.0.1", "data:", "blob:", "about:"))


def test_graph_columns_notes_and_search(server, page):
    """Issue 22's views in one walk: the branch graph (click a node opens it), three traces side by side (one
    scroll, one colour scale, differences underlined), a note marked on its token with no outside request even
    when it holds a Markdown image (defect 1), and a search hit opened at its token."""
    from core.io.store import TraceStore

    url, store_dir, log = server
    outside: list[str] = []
    page.on("request", lambda r: None if _local(r.url) else outside.append(r.url))
    page.goto(f"{url}?problem=demo-20260101-1")  # its root (made here if the store has none: the first view
    _wait_trace(page)  # opens the store's most recent trace), a trace with a token where the reasoner differs
    parent = re.search(r"trace=([0-9a-f]+)", page.url).group(1)
    store = TraceStore(store_dir)
    trace = store.get(parent)
    differs = [p for p in range(1, len(trace)) if int(trace.topk["reason"][0][p][0]) != int(trace.token_ids[p])]
    attempts = [(p, b) for p in differs[:3] for b in ("Reasoning model takes over here", "Branch with this token")]
    for pos, button in attempts:  # the take-over journey made branches when it ran before this test
        have = len(TraceStore(store_dir).children(parent))
        if have >= 2:
            break
        page.goto(f"{url}?trace={parent}")
        _wait_trace(page)
        click_mode(page, "select")  # a click selects (flip mode opens a child)
        _select(page, pos)
        page.get_by_role("button", name=button).click()  # an identical branch is the parent's existing child
        page.locator('.fp-compare[data-side="branch"]').wait_for()
        settle(page)
    assert len(TraceStore(store_dir).children(parent)) >= 2
    kids = store.children(parent)
    # the graph: every trace of the tree a node; a click on a child's node opens it
    page.goto(f"{url}?trace={parent}")
    _wait_trace(page)
    page.wait_for_function(f"() => !!({NODE_XY_JS})('{kids[0]}')")
    _shot(page, "branch_graph")
    x, y = page.evaluate(NODE_XY_JS, kids[0])
    page.mouse.click(x, y)
    page.wait_for_function(f"() => window.location.search.includes('trace={kids[0]}')")
    _wait_trace(page)
    _no_error(page, "graph click", log)
    # side by side: the parent with two of its branches
    page.goto(f"{url}?trace={parent}")
    _wait_trace(page)
    box = page.locator(f".st-key-cmp_pick_{parent}")
    for k in kids[:2]:
        box.locator("input").first.click()
        page.get_by_role("option", name=re.compile(k[:8])).first.click()
        settle(page)
    columns = page.locator(".fp-cmp-grid .fp-compare")
    columns.nth(2).wait_for()
    assert columns.count() == 3
    assert page.locator(".fp-cmp-grid .fp-cmp-head").count() == 3  # outcome on top of each column
    same_scroll = page.evaluate("""() => { const cols = [...document.querySelectorAll('.fp-cmp-grid .fp-compare')];
        const g = cols[0].closest('.fp-cmp-grid'); return cols.every(c => c.closest('.fp-cmp-grid') === g)
        && getComputedStyle(g).overflowY === 'auto' && cols.every(c => getComputedStyle(c).overflowY === 'visible'); }""")
    assert same_scroll  # one scroll container: the columns move in step
    first_pos = int(columns.nth(0).locator("[data-pos]").first.get_attribute("data-pos"))
    main = _bg(page, f'.fp-scroll [data-pos="{first_pos}"]')
    assert _bg(page, f'.fp-compare[data-side="original"] [data-pos="{first_pos}"]') == main  # one colour scale
    assert page.locator(".fp-cmp-grid .tok.diff").count() >= 1
    # issue 31 (D3a): the open trace's column marks where a flip changes the text, as the live view does
    from core.views.presentation import flip_changes

    points = [p for p in flip_changes(trace) if p >= first_pos]
    marked = columns.nth(0).locator(".tok.fp-matter").evaluate_all("els => els.map(e => Number(e.dataset.pos))")
    assert points and marked == points, (marked, points)
    look = ("e => { const s = getComputedStyle(e); return [s.textDecorationLine, s.textDecorationStyle, "
            "s.textDecorationColor, s.textDecorationThickness]; }")
    drawn_as = columns.nth(0).locator(f'[data-pos="{points[0]}"]').evaluate(look)
    assert drawn_as[:2] == ["underline", "dotted"]
    assert drawn_as == page.locator(f'.fp-scroll [data-pos="{points[0]}"]').first.evaluate(look)  # the same marker
    _no_error(page, "side by side", log)
    _shot(page, "side_by_side")
    # a note with a Markdown image: marked on its token, shown as text, never fetched
    page.get_by_text(re.compile(r"^Notes \(\d+\)$")).first.click()
    form = page.locator('[data-testid="stForm"]').first
    form.locator("textarea").fill("look here ![i](http://example.invalid/x.png)")
    form.get_by_role("button", name="Add note").click()
    # wait for the app's answer before the reload (it would drop a submission still on its way; a CI run once
    # reloaded a page whose note had not been stored)
    saved = page.get_by_text(re.compile(r"^Note saved on token")).first
    saved.or_(page.locator(ERROR_BOXES).first).wait_for()
    _no_error(page, "adding a note", log)
    assert saved.is_visible()
    settle(page)
    page.reload()
    _wait_trace(page)
    marked = page.locator(".fp-scroll .tok.note")
    marked.first.wait_for()
    marked.first.hover()
    page.locator(".fp-card").wait_for(state="visible")
    assert "look here ![i](http://example.invalid/x.png)" in page.locator(".fp-card").inner_text()
    _shot(page, "note_marker")
    assert not outside, f"requests that left the machine: {outside}"
    # search: Problems → Search, a hit opens its trace at the token
    _nav(page, "Problems")
    page.get_by_role("tab", name="Search").click()
    word = next(t for t in store.get(parent).tokens if t.strip().isalpha() and len(t.strip()) >= 3)
    page.locator(".st-key-search_pattern input").fill(word)
    page.keyboard.press("Enter")
    settle(page)
    _no_error(page, "search", log)
    _shot(page, "search")
    _click_first_grid_row(page, "search_table")
    _wait_trace(page)
    assert re.search(r"pos=\d+", page.url), page.url
    _no_error(page, "search hit", log)
