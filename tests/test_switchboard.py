"""The switchboard in a real browser: a click flips a takeover and the response re-flows in place.

Flip a token to the reasoner and back off (the original text returns), force an alternative from the
hover card, move back and forward with the keys, and check the mechanism: the switch goes over the live
route (app/live.py, one HTTP request, no Streamlit rerun before the new text is drawn), the new tokens are
drawn in the token view before the finished view replaces them, and the sidebar (outside the Trace page's
fragment) never reruns. Also on the same page: n / p only select, and measured takeover effects are markers
on the token view (issue 26).
Screenshots go to test-output/switchboard/.
"""

from __future__ import annotations

import re

import pytest

from app.switchboard import CLICK_MODES
from app.trace_panels import PLOT_KEY
from tests.browser import (DEEP_JS, LIVE_TOKENS, ROOT, SentElements, chromium_page, click_mode, drawn,
                           layout_problems, pair_args, require_chromium, run_app, settle)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

OUT = ROOT / "test-output" / "switchboard"

WATCH = """(rootKey) => {
  """ + DEEP_JS + """
  window.__fp = { staleSidebar: 0, streamed: null, viewed: null, mainStaleBeforeView: false, vanished: 0 };
  new MutationObserver((ms) => {
    for (const m of ms) {
      if (m.type === "attributes" && m.target.getAttribute("data-stale") === "true"
          && m.target.closest('[data-testid="stSidebar"]')) window.__fp.staleSidebar += 1;
    }
  }).observe(document.body, { attributes: true, attributeFilter: ["data-stale"], subtree: true });
  // when the streamed text and the finished view (the token view's data-key) appear, whether any of the
  // page went stale (a Streamlit run) before the finished view was drawn, and the frames without the token view
  // (remounted by a run, the text vanished for a moment), from here on
  const tick = () => {
    const f = window.__fp, now = performance.now();
    const live = deep(".fp-live");
    if (f.streamed === null && live && live.textContent.length) f.streamed = now;
    const scroll = deep(".fp-scroll");
    if (!scroll || !scroll.querySelector("[data-pos], .fp-live")) f.vanished += 1;
    if (f.viewed === null && scroll && scroll.dataset.key && scroll.dataset.key !== rootKey) f.viewed = now;
    if (f.viewed === null && document.querySelector('[data-testid="stMain"] [data-stale="true"]')) f.mainStaleBeforeView = true;
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}"""


PROBLEM = "demo-20260101-1"  # a demo problem whose base trace has a token where the reasoner writes another


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """The app on an empty store, its first trace made as a user makes it (the empty state's Generate); yields
    that trace's URL (every test starts from it), the store and the page."""
    require_chromium(" (.ci/run installs it)")
    OUT.mkdir(parents=True, exist_ok=True)
    store = tmp_path_factory.mktemp("switchboard_store")
    with run_app(["--store", str(store), *pair_args(tmp_path_factory)], OUT / "streamlit.log") as url:
        with chromium_page(tmp_path_factory.mktemp("profile"), viewport={"width": 1440, "height": 1400}) as page:
            page.goto(f"{url}?problem={PROBLEM}")
            page.get_by_role("button", name="Generate").click()
            page.locator(".fp-scroll [data-pos]").first.wait_for()
            page.wait_for_function("() => window.location.search.includes('trace=')")
            yield f"{url}?trace={_key(page)}", store, page


def _open(page, url: str) -> None:
    """Open `url` and wait until the page is as a reader finds it before a click: the live view drawn, then the
    charts a new session sends once that view has drawn (their fragments' run: a click during it saw that run's
    stale elements, not the switch's, in one CI run), and Streamlit's runs over."""
    page.goto(url)
    page.locator(LIVE_TOKENS).first.wait_for()  # the live view, not the shell's first paint
    page.wait_for_function("() => window.location.search.includes('trace=')")
    page.locator(".js-plotly-plot .main-svg").first.wait_for()
    settle(page)


def _key(page) -> str:
    return re.search(r"trace=([0-9a-f]+)", page.url).group(1)


def _text(page) -> str:
    return "".join(page.locator(".fp-scroll [data-pos]").all_inner_texts())


def _click_and_wait(page, locator) -> str:
    """Click, then wait until the open trace (the URL) changes, its view is drawn and Streamlit's runs are over;
    the new key."""
    before = _key(page)
    locator.click()
    page.wait_for_function("(k) => !window.location.search.includes('trace=' + k)", arg=before)
    page.locator(".fp-scroll [data-pos]").first.wait_for()
    settle(page)
    return _key(page)


def test_flip_a_takeover_on_and_off_again(app):
    url, store_dir, page = app
    from core.io.store import TraceStore

    posts: list[str] = []  # requests to the live route
    page.on("request", lambda r: posts.append(r.method) if r.url.endswith("/_forkpoint/switch") else None)
    _open(page, url)
    root = _key(page)
    page.evaluate(WATCH, root)
    trace = TraceStore(store_dir).get(root)
    original = _text(page)
    # an early base token whose reasoner favourite differs: the continuation must change
    pos = next(p for p in range(len(trace)) if trace.source[p] == "base"
               and int(trace.topk["reason"][0][p][0]) != int(trace.token_ids[p]))
    child = _click_and_wait(page, page.locator(f'.fp-scroll [data-pos="{pos}"]'))
    assert child != root
    token = page.locator(f'.fp-scroll [data-pos="{pos}"]')
    assert {"src-reason", "sw"} <= set(token.get_attribute("class").split())
    flipped = _text(page)
    assert flipped != original
    assert page.get_by_text(re.compile(rf"#{pos} reasoner")).first.is_visible()  # outcome line and switch list
    page.screenshot(path=str(OUT / "flipped.png"))
    stored = TraceStore(store_dir).get(child)
    assert stored.meta["switches"] == {str(pos): "reason"} and stored.meta["parent"] == root
    from core.views.presentation import flip_changes

    marked = sorted(int(p) for p in page.locator(".fp-scroll [data-pos].fp-matter").evaluate_all(
        "els => els.map(e => e.dataset.pos)"))
    assert marked == flip_changes(stored)  # the re-flowed view's HTML marks its own switch points (issue 31)
    assert posts == ["POST"], "the switch did not go over the live route"
    seen = page.evaluate("() => window.__fp")
    assert seen["streamed"] is not None, "the new tokens never streamed into the token view"
    assert seen["streamed"] <= seen["viewed"], "the finished view came before the stream"
    assert not seen["mainStaleBeforeView"], "a Streamlit run came before the re-flowed text"
    assert seen["vanished"] == 0, "the text vanished during the switch (the token view was remounted)"

    back = _click_and_wait(page, page.locator(f'.fp-scroll [data-pos="{pos}"]'))  # switched off again
    assert back == root and _text(page) == original
    again = _click_and_wait(page, page.locator(f'.fp-scroll [data-pos="{pos}"]'))
    assert again == child  # the same switch is the same stored trace
    assert page.evaluate("() => window.__fp.staleSidebar") == 0, "a switch reran the whole page"
    assert page.evaluate("() => window.__fp.vanished") == 0, "the text vanished during a switch"

    # b / f are the browser's Back / Forward (Streamlit reruns the page there); each waits until the page has
    # followed the URL and drawn that trace's view (it draws after the run ends), as a reader would before the
    # next key
    for key, want, text in (("b", root, original), ("f", child, flipped)):
        page.locator("body").press(key)
        page.wait_for_function("(k) => window.location.search.includes('trace=' + k)", arg=want)
        settle(page)
        view = page.locator(f'.fp-scroll[data-key="{want}"] [data-pos]')
        view.first.wait_for()
        assert "".join(view.all_inner_texts()) == text


def test_an_alternative_in_the_hover_card_is_forced_there(app):
    url, store_dir, page = app
    from core.io.store import TraceStore

    _open(page, url)
    trace = TraceStore(store_dir).get(_key(page))
    pos = 3
    page.locator(f'.fp-scroll [data-pos="{pos}"]').hover()
    card = page.locator(".fp-card")
    card.wait_for(state="visible")
    row = card.locator(".fp-top-base tr.alt").first
    alt = int(row.get_attribute("data-token"))
    assert alt != int(trace.token_ids[pos])
    row.hover()  # the card stays while the pointer moves into it
    child = _click_and_wait(page, row)
    forced = TraceStore(store_dir).get(child)
    assert int(forced.token_ids[pos]) == alt and forced.source[pos] == "forced"
    assert "src-forced" in page.locator(f'.fp-scroll [data-pos="{pos}"]').get_attribute("class")
    page.screenshot(path=str(OUT / "forced.png"))


def test_n_and_p_select_a_switch_point_without_switching(app):
    """In flip mode n / p walk the tokens where a flip changes the text (marked, and counted in the header)."""
    url, store_dir, page = app
    from core.io.store import TraceStore
    from core.views.presentation import flip_changes

    _open(page, url)
    key = _key(page)
    points = flip_changes(TraceStore(store_dir).get(key))
    marked = sorted(int(p) for p in page.locator(".fp-scroll [data-pos].fp-matter").evaluate_all(
        "els => els.map(e => e.dataset.pos)"))
    assert points and marked == points, (marked, points)
    count = page.locator('[data-testid="stMetric"]').filter(has_text="Switch points")
    assert count.locator('[data-testid="stMetricValue"]').inner_text().strip() == str(len(points))
    page.locator("body").press("n")
    page.wait_for_function("(p) => window.location.search.includes('pos=' + p)", arg=points[0])
    page.wait_for_timeout(500)
    assert _key(page) == key  # in flip mode too, the keys only select


def test_measured_effects_are_markers_on_the_token_view(app):
    """Issue 26: "Measure effects" puts a marker on each measured token of the token view, the numbers on hover."""
    url, _, page = app
    _open(page, url)
    page.get_by_text("Instruments: takeover effects").click()
    page.get_by_role("spinbutton", name="Samples per arm").fill("2")
    page.keyboard.press("Enter")
    settle(page)  # the Enter's run first, as a reader waits for the page before the next click
    page.get_by_role("button", name="Measure effects").click()
    marker = page.locator(".fp-scroll [data-fx]").first
    marker.wait_for(timeout=120_000)
    spikes = {int(p) for p in page.locator(".fp-scroll [data-pos].spike").evaluate_all(
        "els => els.map(e => e.dataset.pos)")}
    marked = {int(p) for p in page.locator(".fp-scroll [data-fx]").evaluate_all("els => els.map(e => e.dataset.pos)")}
    assert marked == spikes  # the default positions: the trace's spikes
    marker.hover()
    card = page.locator(".fp-card")
    card.wait_for(state="visible")
    assert re.search(r"effect [+−-]\d\.\d\d \[[+−-]?\d\.\d\d, [+−-]?\d\.\d\d\] · acc with", card.inner_text())
    page.screenshot(path=str(OUT / "effects.png"))


def test_without_the_live_route_a_click_still_switches_through_a_rerun(app):
    """The live route unreachable (a server started with plain `streamlit run`, a proxy that drops it): the click
    goes the Streamlit way instead, streamed into the fragment, with the same stored child."""
    url, store_dir, page = app
    from core.io.store import TraceStore

    _open(page, url)
    root = _key(page)
    trace = TraceStore(store_dir).get(root)
    pos = next(p for p in range(len(trace)) if trace.source[p] == "base"
               and int(trace.topk["reason"][0][p][0]) != int(trace.token_ids[p]) and p > 3)
    page.route("**/_forkpoint/switch", lambda route: route.abort())
    try:
        child = _click_and_wait(page, page.locator(f'.fp-scroll [data-pos="{pos}"]'))
    finally:
        page.unroute("**/_forkpoint/switch")
    stored = TraceStore(store_dir).get(child)
    assert stored.meta["switches"] == {str(pos): "reason"} and stored.meta["parent"] == root
    assert "src-reason" in page.locator(f'.fp-scroll [data-pos="{pos}"]').get_attribute("class")


def _history_length(page) -> int:
    return page.evaluate("() => window.history.length")


def test_a_flip_that_changes_no_token_says_so_and_adds_no_history_step(app):
    """Issue 31: a base token whose reasoner top token is the same token: no new trace, no history step, and the
    page says "the reasoner writes ' x' here too: nothing changes"."""
    url, store_dir, page = app
    from core.io.store import TraceStore
    from core.views.presentation import flip_changes

    _open(page, url)
    root = _key(page)
    store = TraceStore(store_dir)
    trace = store.get(root)
    points = set(flip_changes(trace))
    pos = next(p for p in range(1, len(trace)) if p not in points and trace.source[p] == "base")
    n_keys, steps = len(store.keys()), _history_length(page)
    page.locator(f'.fp-scroll [data-pos="{pos}"]').click()
    note = page.locator(".fp-note")
    note.wait_for(state="visible")
    assert note.inner_text() == f"#{pos}: the reasoner writes {trace.tokens[pos]!r} here too: nothing changes"
    page.wait_for_timeout(1000)
    assert _key(page) == root and _history_length(page) == steps
    assert len(TraceStore(store_dir).keys()) == n_keys  # nothing stored
    # the token panel follows the click (it showed the token selected before), and the line stays
    page.get_by_text(f"Token #{pos}", exact=False).first.wait_for()
    assert note.inner_text().endswith("here too: nothing changes")
    assert page.locator('button:has-text("◀ back")').first.is_disabled()  # no step in the switch history
    page.screenshot(path=str(OUT / "noop.png"))


def test_arrow_keys_move_the_cursor_and_enter_flips(app):
    url, store_dir, page = app
    from core.io.store import TraceStore
    from core.views.presentation import flip_changes

    _open(page, url)
    root = _key(page)
    pos = flip_changes(TraceStore(store_dir).get(root))[0]
    body = page.locator("body")
    body.press("ArrowRight")  # the cursor appears on the first token
    for _ in range(pos + 1):
        body.press("ArrowRight")
    body.press("ArrowLeft")
    page.locator(f'.fp-scroll [data-pos="{pos}"].cur').wait_for()
    assert page.locator(".fp-scroll .tok.cur").count() == 1 and _key(page) == root  # moving only moves
    body.press("Enter")
    page.wait_for_function("(k) => !window.location.search.includes('trace=' + k)", arg=root)
    child = TraceStore(store_dir).get(_key(page))
    assert child.meta["switches"] == {str(pos): "reason"} and child.meta["parent"] == root
    body.press("?")  # the key list
    assert page.locator(".fp-keys").is_visible() and "Enter / Space" in page.locator(".fp-keys").inner_text()
    body.press("Escape")
    assert not page.locator(".fp-keys").is_visible()


def test_browser_back_undoes_a_flip_and_forward_redoes_it(app):
    """One browser-history entry per switch state; the browser's Back / Forward walk the states as b / f do."""
    url, store_dir, page = app
    from core.io.store import TraceStore
    from core.views.presentation import flip_changes

    _open(page, url)
    root = _key(page)
    pos = flip_changes(TraceStore(store_dir).get(root))[0]
    steps = _history_length(page)
    child = _click_and_wait(page, page.locator(f'.fp-scroll [data-pos="{pos}"]'))
    assert child != root
    page.wait_for_timeout(800)
    assert _history_length(page) == steps + 1  # one entry for the new state (not one per URL parameter)
    page.go_back()
    page.wait_for_function("(k) => window.location.search.includes('trace=' + k)", arg=root)
    page.locator(f'.fp-scroll[data-key="{root}"]').wait_for()
    assert "sw" not in (page.locator(f'.fp-scroll [data-pos="{pos}"]').get_attribute("class") or "").split()
    page.go_forward()
    page.locator(f'.fp-scroll[data-key="{child}"]').wait_for()
    page.locator("body").press("b")  # b is the browser's Back
    page.wait_for_function("(k) => window.location.search.includes('trace=' + k)", arg=root)
    page.locator(f'.fp-scroll[data-key="{root}"]').wait_for()
    assert _history_length(page) == steps + 1


def test_a_link_without_its_problem_takes_one_history_entry(app):
    """A link that names the trace alone (`?trace=KEY`, the fixture's): the app writes its problem into the URL in
    place of the link's entry (app/first_paint.py PAGE_JS, before Streamlit's first push), not as a second entry
    (Back from the first flip's child then went to the parent, a second Back stayed on it, the third left)."""
    url, store_dir, page = app
    from core.io.store import TraceStore
    from core.views.presentation import flip_changes

    assert "problem=" not in url
    fresh = page.context.new_page()  # a new tab: about:blank, one entry
    try:
        steps = _history_length(fresh)
        _open(fresh, url)
        fresh.wait_for_function("() => window.location.search.includes('problem=')")
        root = _key(fresh)
        assert _history_length(fresh) == steps + 1  # the link's entry, its problem written into it
        pos = flip_changes(TraceStore(store_dir).get(root))[0]
        child = _click_and_wait(fresh, fresh.locator(f'.fp-scroll [data-pos="{pos}"]'))
        fresh.wait_for_timeout(800)
        assert child != root and _history_length(fresh) == steps + 2
        fresh.go_back()
        fresh.locator(f'.fp-scroll[data-key="{root}"]').wait_for()
        fresh.go_back()  # out of the app
        fresh.wait_for_url("about:blank")
    finally:
        fresh.close()


def test_a_click_mode_chosen_with_the_pointer_leaves_the_arrow_keys_to_the_cursor(app):
    """After a click on "types there", → moves the token cursor (the mode control kept the keyboard focus and its →
    walked its options, the cursor never came); a mode option reached with the keyboard keeps its arrow keys."""
    url, _, page = app
    _open(page, url)
    try:
        click_mode(page, "edit")  # the pointer
        page.keyboard.press("ArrowRight")  # to whatever has the focus (not body.press: that would focus the body)
        page.keyboard.press("ArrowRight")
        page.locator('.fp-scroll [data-pos="1"].cur').wait_for()
        assert page.locator(".fp-scroll").get_attribute("data-mode") == "edit"
        page.get_by_role("radio", name=CLICK_MODES["flip"]).focus()  # the keyboard's way in
        page.keyboard.press("ArrowRight")
        assert page.evaluate("() => document.activeElement.innerText.trim()") == CLICK_MODES["edit"]
    finally:
        click_mode(page, "flip")


def test_edit_and_continue_opens_the_new_trace_with_the_typed_tokens_marked(app):
    """Edit mode: click a token, type, Enter: the base continues from the typed text, the new trace is the open
    one (the parent one step back), and the typed tokens are drawn as the user's."""
    url, store_dir, page = app
    from core.io.store import TraceStore

    _open(page, url)
    root = _key(page)
    click_mode(page, "edit")
    pos = 6
    page.locator(f'.fp-scroll [data-pos="{pos}"]').click()
    box = page.locator(".fp-edit")
    box.wait_for()
    assert box.get_attribute("maxlength") == "1000"  # app/live.py MAX_TYPED, sent with the view
    box.press("Enter")  # nothing typed: said, and the box stays
    assert page.locator(".fp-note").inner_text() == f"Type the text to write from #{pos} first (Escape cancels)"
    box.fill(" Let me")
    box.press("Enter")
    page.wait_for_function("(k) => !window.location.search.includes('trace=' + k)", arg=root)
    page.locator(".fp-scroll [data-pos]").first.wait_for()
    key = _key(page)
    child = TraceStore(store_dir).get(key)
    parent = TraceStore(store_dir).get(root)
    assert child.meta["parent"] == root and child.token_ids[:pos].tolist() == parent.token_ids[:pos].tolist()
    assert "".join(child.tokens[pos:]).startswith(" Let me")
    typed = [p for p in range(len(child)) if child.source[p] == "forced"]
    assert typed and typed[0] == pos
    page.locator(f'.fp-scroll[data-key="{key}"]').wait_for()
    for p in typed:
        assert "src-forced" in page.locator(f'.fp-scroll [data-pos="{p}"]').get_attribute("class")
    page.screenshot(path=str(OUT / "edited.png"))
    page.locator("body").press("b")  # the parent is one step back
    page.wait_for_function("(k) => window.location.search.includes('trace=' + k)", arg=root)
    click_mode(page, "flip")


def test_at_800px_no_control_is_cut(app):
    """At 800 px the sidebar is closed and no control or label of the Trace page is cut by the window or by
    another element (boxes inside the window, labels not truncated, no two controls overlapping)."""
    url, _, page = app
    page.set_viewport_size({"width": 800, "height": 1400})
    try:
        page.goto(url)  # a fresh page load at this width
        page.locator(LIVE_TOKENS).first.wait_for()
        drawn(page)  # the runs over, grids, figures and fonts drawn
        assert page.locator('[data-testid="stSidebar"]').get_attribute("data-collapsed") == "true"
        problems = layout_problems(page)
        page.set_viewport_size({"width": 800, "height": 2400})
        drawn(page)
        page.screenshot(path=str(OUT / "narrow_800.png"))
        assert problems == [], problems
    finally:
        page.set_viewport_size({"width": 1440, "height": 1400})


def test_a_selection_reruns_neither_the_plot_nor_the_graph_and_a_switch_both(app):
    """Issue 31 (c): the page redraws only what changed. The score plot and the branch graph are fragments of
    their own: a selection reruns the text and the selection panel, never them; a switch reruns them. Counted
    from what the server sends (SentElements), not from what goes stale on screen (a quick run shows nothing stale)."""
    url, store_dir, page = app
    from core.io.store import TraceStore
    from core.views.presentation import flip_changes

    with SentElements(page) as sent:
        _open(page, url)
        root = _key(page)
        points = flip_changes(TraceStore(store_dir).get(root))
        child = _click_and_wait(page, page.locator(f'.fp-scroll [data-pos="{points[0]}"]'))  # a tree: the graph is drawn
        page.locator("[class*='st-key-tree_graph_'] .js-plotly-plot").first.wait_for()
        click_mode(page, "select")
        sent.on = True
        for pos in (2, 5):  # two selections: the URL and the selection panel follow each
            page.locator(f'.fp-scroll [data-pos="{pos}"]').click()
            page.wait_for_function("(p) => window.location.search.includes('pos=' + p)", arg=pos)
            page.get_by_text(re.compile(rf"^Token #{pos}$")).first.wait_for()
        settle(page)  # every run the selections started is over
        assert sent.with_key("button", "sw_back"), sent  # the text's fragment reran (its ◀ back came again)
        assert not sent.with_key("plotly_chart", ""), sent
        assert _key(page) == child
        sent.clear()
        page.mouse.move(0, 0)
        page.locator('.fp-scroll [data-pos="3"]').hover()  # a switch: a hover-card alternative forced
        row = page.locator(".fp-card .fp-top-base tr.alt").first
        row.wait_for()
        row.hover()
        _click_and_wait(page, row)
        assert sent.with_key("plotly_chart", PLOT_KEY) and sent.with_key("plotly_chart", "tree_graph_"), sent


def test_at_800px_the_switch_list_and_the_selection_fit(app):
    """At 800 px with two switches in force and a token selected (the switch list and the selection panel share the
    narrow right column): no control, label or table is cut by the window or by another element."""
    url, _, page = app
    page.set_viewport_size({"width": 800, "height": 1400})
    try:
        _open(page, url)
        for pos in (3, 9):  # two hover-card alternatives forced: two rows in the switch list
            page.locator(f'.fp-scroll [data-pos="{pos}"]').hover()
            row = page.locator(".fp-card .fp-top-base tr.alt").first
            row.wait_for(state="visible")
            row.hover()
            _click_and_wait(page, row)
        page.get_by_text("Switches (2)").wait_for()
        page.get_by_text("Token #9").wait_for()  # the last forced token is selected
        drawn(page)  # the runs over, grids, figures and fonts drawn
        problems = layout_problems(page)
        page.screenshot(path=str(OUT / "narrow_800_switched.png"), full_page=True)
        assert problems == [], problems
    finally:
        page.set_viewport_size({"width": 1440, "height": 1400})
