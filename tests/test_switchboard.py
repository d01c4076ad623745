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

from tests.browser import DEEP_JS, ROOT, chromium_page, pair_args, require_chromium, run_app

pytestmark = [pytest.mark.browser, pytest.mark.slow]

OUT = ROOT / "test-output" / "switchboard"

WATCH = """(rootKey) => {
  """ + DEEP_JS + """
  window.__fp = { staleSidebar: 0, streamed: null, viewed: null, mainStaleBeforeView: false };
  new MutationObserver((ms) => {
    for (const m of ms) {
      if (m.type === "attributes" && m.target.getAttribute("data-stale") === "true"
          && m.target.closest('[data-testid="stSidebar"]')) window.__fp.staleSidebar += 1;
    }
  }).observe(document.body, { attributes: true, attributeFilter: ["data-stale"], subtree: true });
  // when the streamed text and the finished view (the token view's data-key) appear, and whether any of the
  // page went stale (a Streamlit run) before the finished view was drawn
  const tick = () => {
    const f = window.__fp, now = performance.now();
    const live = deep(".fp-live");
    if (f.streamed === null && live && live.textContent.length) f.streamed = now;
    const scroll = deep(".fp-scroll");
    if (f.viewed === null && scroll && scroll.dataset.key && scroll.dataset.key !== rootKey) f.viewed = now;
    if (f.viewed === null && document.querySelector('[data-testid="stMain"] [data-stale="true"]')) f.mainStaleBeforeView = true;
    if (f.viewed === null) requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}"""


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    require_chromium(" (.ci/run installs it)")
    OUT.mkdir(parents=True, exist_ok=True)
    store = tmp_path_factory.mktemp("switchboard_store")
    with run_app(["--store", str(store), *pair_args(tmp_path_factory)], OUT / "streamlit.log") as url:
        with chromium_page(tmp_path_factory.mktemp("profile"), viewport={"width": 1440, "height": 1400}) as page:
            yield url, store, page


def _open(page, url: str) -> None:
    page.goto(url)
    page.locator(".fp-scroll [data-pos]").first.wait_for()
    page.wait_for_function("() => window.location.search.includes('trace=')")


def _key(page) -> str:
    return re.search(r"trace=([0-9a-f]+)", page.url).group(1)


def _text(page) -> str:
    return "".join(page.locator(".fp-scroll [data-pos]").all_inner_texts())


def _click_and_wait(page, locator) -> str:
    """Click, then wait until the open trace (the URL) changes and its view is drawn; the new key."""
    before = _key(page)
    locator.click()
    page.wait_for_function("(k) => !window.location.search.includes('trace=' + k)", arg=before)
    page.locator(".fp-scroll [data-pos]").first.wait_for()
    page.wait_for_timeout(300)
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
    assert _text(page) != original
    assert page.get_by_text(re.compile(rf"#{pos} reasoner")).first.is_visible()  # outcome line and switch list
    page.screenshot(path=str(OUT / "flipped.png"))
    stored = TraceStore(store_dir).get(child)
    assert stored.meta["switches"] == {str(pos): "reason"} and stored.meta["parent"] == root
    assert posts == ["POST"], "the switch did not go over the live route"
    seen = page.evaluate("() => window.__fp")
    assert seen["streamed"] is not None, "the new tokens never streamed into the token view"
    assert seen["streamed"] <= seen["viewed"], "the finished view came before the stream"
    assert not seen["mainStaleBeforeView"], "a Streamlit run came before the re-flowed text"

    back = _click_and_wait(page, page.locator(f'.fp-scroll [data-pos="{pos}"]'))  # switched off again
    assert back == root and _text(page) == original
    again = _click_and_wait(page, page.locator(f'.fp-scroll [data-pos="{pos}"]'))
    assert again == child  # the same switch is the same stored trace

    page.locator("body").press("b")  # back through the history
    page.wait_for_function("(k) => window.location.search.includes('trace=' + k)", arg=root)
    page.locator("body").press("f")
    page.wait_for_function("(k) => window.location.search.includes('trace=' + k)", arg=child)
    assert page.evaluate("() => window.__fp.staleSidebar") == 0, "a switch reran the whole page"


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


def test_n_and_p_select_a_spike_without_switching(app):
    url, _, page = app
    _open(page, url)
    key = _key(page)
    spikes = sorted(int(p) for p in page.locator(".fp-scroll [data-pos].spike").evaluate_all(
        "els => els.map(e => e.dataset.pos)"))
    assert spikes, "the token view marks no spike"
    page.locator("body").press("n")
    page.wait_for_function("(p) => window.location.search.includes('pos=' + p)", arg=spikes[0])
    page.wait_for_timeout(500)
    assert _key(page) == key  # in flip mode too, the keys only select


def test_measured_effects_are_markers_on_the_token_view(app):
    """Issue 26: "Measure effects" puts a marker on each measured token of the token view, the numbers on hover."""
    url, _, page = app
    _open(page, url)
    page.get_by_text("Instruments: takeover effects").click()
    page.get_by_role("spinbutton", name="Samples per arm").fill("2")
    page.keyboard.press("Enter")
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
