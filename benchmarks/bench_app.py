"""The switchboard's latency in a real browser: a click on a token of the demo pair's first trace until
(a) the first changed token is visible, (b) the whole re-flowed response and its outcome line are drawn
in the token view, and (c) the rest of the page has caught up (header, switch list, branch graph, URL),
beside the same switches timed through `core` alone (set_switches: what the click runs).

    .venv/bin/python benchmarks/bench_app.py [--clicks 10] [--more-traces N] [--write]

Drives `forkpoint app`'s server (app/serve.py: the switchboard's live route) in Debian's Chromium
(Playwright) on a store holding one greedy demo trace (what a user's first Generate makes). Each click forces a
hover-card alternative at a different position (a new trace each time: on the demo pair almost every plain flip
changes no token, and those are answered "nothing changes" without a new trace, timed apart), then `b` goes
back; at the end the first position is switched again (the card's next alternative: as many tokens to decode as
the first switch, so "first switch within 1.5x of later ones" compares like with like). Also timed: a shared trace link and the Dataset page opened in fresh browsers. --write replaces the
"## Switchboard" section of benchmarks/RESULTS.md. Targets (issue 31, quiet 2-core machine): (a) <= 0.15 s,
(b) <= 0.3 s, (c) <= 0.5 s, first switch within 1.5x of later ones, link <= 1.5 s, Dataset <= 2 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from benchmarks.results import host, write_section  # noqa: E402
from tests.browser import DEEP_JS, LIVE_TOKENS, chromium_page, run_app  # noqa: E402

SECTION = "## Switchboard"
WATCH = """(rootKey) => {
  // timed in the page from the pointer press on the token: (a) the first streamed token drawn, (b) the
  // token view showing the new trace (its key) with its outcome line, (c) the new trace's URL with nothing
  // left stale (the Trace fragment's run is over and drawn). The token view lives in a shadow root.
  """ + DEEP_JS + """
  window.__fpWatch = new Promise((resolve) => {
    let t0 = null, first = null, view = null;
    document.addEventListener("pointerdown", () => { if (t0 === null) t0 = performance.now(); }, { capture: true, once: true });
    const tick = () => {
      if (t0 !== null) {
        const now = performance.now() - t0;
        const live = deep(".fp-live") || document.querySelector(".fp-stream .new");
        if (first === null && live && live.textContent.length) first = now;
        const scroll = deep(".fp-scroll"), outcome = deep(".fp-outcome");
        if (view === null && scroll && scroll.dataset.key && scroll.dataset.key !== rootKey
            && outcome && outcome.textContent.includes("takeovers · ρ")) view = now;
        const moved = !window.location.search.includes("trace=" + rootKey);
        const stale = document.querySelector('[data-testid="stMain"] [data-stale="true"]');
        if (view !== null && moved && !stale) {
          resolve([first === null ? view : first, view, now]);
          return;
        }
      }
      requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
    setTimeout(() => resolve([null, null, null]), 30000);
  });
}"""


def _key(page) -> str:
    return page.url.split("trace=")[1].split("&")[0]


def _seed(store_dir: Path, problem_index: int) -> str:
    """A store holding one greedy base trace, as a user's first Generate makes it (the app writes nothing unasked)."""
    import core
    from app.actions import first_trace
    from core.io.store import TraceStore

    pair = core.demo_pair()
    problem = core.demo_problems(limit=problem_index + 1)[problem_index]
    return first_trace(pair, TraceStore(store_dir), problem, 154).key


def _more_traces(store_dir: Path, n: int) -> None:
    """`n` more traces in the store, as an evaluation leaves it: sampled answers of the demo problems by three
    policies (the app lists the store on every click, so its size is part of what a click costs)."""
    import core
    from core.io.store import TraceStore

    pair, problems, store = core.demo_pair(), core.demo_problems(), TraceStore(store_dir)
    wanted = len(store.keys()) + n
    for i, policy in enumerate(("base_only", "reason_only", "entropy_gated") * (1 + n // (3 * len(problems)))):
        left = wanted - len(store.keys())
        if left <= 0:
            break
        core.generate(pair, problems[:min(len(problems), left)], core.make_policy(policy), max_new_tokens=96,
                      store=store, temperature=0.7, seed=1 + i)


def _alternative(root, pos: int) -> int:
    """The first token of the base's top-k at `pos` that is not the emitted one (the hover card's first row
    that forces another token)."""
    return next(int(t) for t in root.topk["base"][0][pos] if int(t) != int(root.token_ids[pos]))


def _fresh(tmp: Path, name: str, url: str, selector: str, then: str | None = None) -> tuple[float, float | None]:
    """Seconds from navigation to `selector` visible in a browser with an empty profile, and to `then` after it
    (None without `then`). The clock does not wait for the page's load event (goto's default: all ~120 of
    Streamlit's script files fetched), which a shell's first paint is drawn well before."""
    with chromium_page(tmp / name, viewport={"width": 1440, "height": 1400}) as page:
        t0 = time.perf_counter()
        page.goto(url, wait_until="commit")
        page.locator(selector).first.wait_for()
        first = time.perf_counter() - t0
        if then is None:
            return first, None
        page.locator(then).first.wait_for()
        return first, time.perf_counter() - t0


def measure(clicks: int, more: int = 0) -> dict:
    import core
    from core.decoding.takeover import set_switches, switches_in_force
    from core.io.store import TraceStore
    from core.views.presentation import flip_changes

    machine = host()  # its load before the run
    tmp = Path(tempfile.mkdtemp(prefix="bench_app_"))
    store_dir = tmp / "store"
    root_key = _seed(store_dir, 1)
    _more_traces(store_dir, more)
    root = TraceStore(store_dir).get(root_key)
    first, full, page_done, alone, positions, same = [], [], [], [], [], []
    with run_app(["--store", str(store_dir)], tmp / "streamlit.log") as url:
        # the first token whichever view draws it (the shell's first paint, app/first_paint.py, or the live view),
        # then the live token view's own
        link, link_live = _fresh(tmp, "fresh_link", f"{url}?trace={root_key}", ".fp-scroll [data-pos]", LIVE_TOKENS)
        # the first chart whichever draws it (the shell's first paint, app/first_paint.py, or Streamlit), then Streamlit's own
        dataset, dataset_live = _fresh(tmp, "fresh_dataset", f"{url}dataset", ".js-plotly-plot .main-svg",
                                       '[data-testid="stMain"] .js-plotly-plot .main-svg')
        with chromium_page(tmp / "profile", viewport={"width": 1440, "height": 1400}) as page:
            page.goto(f"{url}?trace={root_key}")
            page.locator(LIVE_TOKENS).first.wait_for()
            page.wait_for_function("() => window.location.search.includes('trace=')")
            page.wait_for_timeout(1000)
            n = len(root)
            step = max(1, (n - 2) // clicks)
            positions = list(range(1, n - 1, step))[:clicks]
            def switch(pos: int, alternative: int) -> tuple[float, float, float]:
                """Force the hover card's `alternative`-th other token at `pos`; (a, b, c) in s; then `b` back."""
                page.locator(f'.fp-scroll [data-pos="{pos}"]').hover()
                row = page.locator(".fp-card .fp-top-base tr.alt").nth(alternative)
                row.wait_for()
                row.hover()
                page.evaluate(WATCH, root_key)
                row.click()
                times = tuple(ms / 1000 for ms in page.evaluate("() => window.__fpWatch"))
                page.locator("body").press("b")
                page.wait_for_function("(k) => window.location.search.includes('trace=' + k)", arg=root_key)
                page.locator(f'.fp-scroll[data-key="{root_key}"]').wait_for()
                page.wait_for_timeout(600)
                return times

            for pos in positions:  # a forced alternative from the hover card: a switch that changes the text
                a, b, c = switch(pos, 0)
                first.append(a)
                full.append(b)
                page_done.append(c)
            # the first switch again, later, with the card's next alternative: as many tokens to decode
            again = switch(positions[0], 1)[1]
            points = set(flip_changes(root))
            for pos in [p for p in range(1, n) if p not in points and root.source[p] == "base"][:5]:
                page.mouse.move(0, 0)
                t0 = time.perf_counter()
                page.locator(f'.fp-scroll [data-pos="{pos}"]').click()
                page.locator(".fp-note").wait_for(state="visible")
                same.append(time.perf_counter() - t0)
                page.wait_for_timeout(300)
    import torch

    torch.set_num_threads(1)  # as the app runs the demo pair (app/resources.load_pair)
    pair = core.demo_pair()
    for pos in positions:  # the same switches, core alone (the parent's caches are not held here: a prefill)
        t0 = time.perf_counter()
        set_switches(pair, root, {**switches_in_force(root), pos: _alternative(root, pos)})
        alone.append(time.perf_counter() - t0)
    return {"positions": positions, "first": first, "full": full, "page": page_done, "alone": alone,
            "n_tokens": len(root), "same": same, "link": link, "link_live": link_live, "dataset": dataset,
            "dataset_live": dataset_live, "again": again, "host": machine, "stored": len(TraceStore(store_dir).keys())}


def report(r: dict) -> str:
    med = statistics.median
    later = r["full"][1:] or r["full"]
    lines = [
        f"{len(r['positions'])} switches (a hover-card alternative forced) on a {r['n_tokens']}-token demo trace "
        f"(positions {r['positions']}) in a store of {r['stored']:,} trace(s); {r['host']}.",
        "",
        "| | median | max |",
        "|---|---|---|",
        f"| (a) click → first changed token visible | {med(r['first']):.3f} s | {max(r['first']):.3f} s |",
        f"| (b) click → whole response and outcome line | {med(r['full']):.3f} s | {max(r['full']):.3f} s |",
        f"| (c) click → the rest of the page (header, switch list, graph, URL) | {med(r['page']):.3f} s | "
        f"{max(r['page']):.3f} s |",
        f"| the same switch through `core` alone (set_switches), parent read from the store | {med(r['alone']):.3f} s "
        f"| {max(r['alone']):.3f} s |",
    ]
    if r["same"]:
        lines.append(f"| a flip that changes no token → \"nothing changes\" shown ({len(r['same'])} clicks, Playwright "
                     f"clock) | {med(r['same']):.3f} s | {max(r['same']):.3f} s |")
    lines += [
        "",
        f"First switch on the freshly opened trace (b): {r['full'][0]:.3f} s; later ones median {med(later):.3f} s "
        f"({r['full'][0] / med(later):.2f}×, but the first is at position {r['positions'][0]}, the most tokens to "
        f"decode); the same position switched again after the others (the card's next alternative, as many tokens): "
        f"{r['again']:.3f} s (first / again {r['full'][0] / r['again']:.2f}×).",
        f"A shared trace URL in a fresh browser to its first token: {r['link']:.2f} s (whichever view draws it: the "
        f"shell's first paint or the live view), to the live token view's first token {r['link_live']:.2f} s; the "
        f"Dataset page by link to its first chart: {r['dataset']:.2f} s (the shell's first paint or Streamlit's), to "
        f"Streamlit's own chart {r['dataset_live']:.2f} s (Playwright clock, from navigation).",
        f"(b) / core: {med(r['full']) / med(r['alone']):.2f}×.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clicks", type=int, default=10)
    parser.add_argument("--more-traces", type=int, default=0,
                        help="this many more traces in the store (an evaluation's: the app lists the store per click)")
    parser.add_argument("--write", action="store_true", help="replace the section in benchmarks/RESULTS.md")
    args = parser.parse_args()
    text = report(measure(args.clicks, args.more_traces))
    print(text)
    if args.write:
        more = f" --more-traces {args.more_traces}" if args.more_traces else ""
        command = f"    .venv/bin/python benchmarks/bench_app.py --clicks {args.clicks}{more} --write"
        write_section(SECTION, f"{SECTION}\n\n{command}\n\n{text}")


if __name__ == "__main__":
    main()
