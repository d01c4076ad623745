"""The switchboard's latency in a real browser: a click on a token of the demo pair's first trace until
(a) the first changed token is visible, (b) the whole re-flowed response and its outcome line are drawn
in the token view, and (c) the rest of the page has caught up (header, switch list, branch graph, URL),
beside the same switches timed through `core` alone (set_switches: what the click runs).

    .venv/bin/python benchmarks/bench_app.py [--clicks 10] [--write]

Drives `forkpoint app`'s server (app/serve.py: the switchboard's live route) in Debian's Chromium
(Playwright) on a fresh store. Each click flips a different base token of the first trace to the reasoner
(a new trace each time), then `b` goes back. --write replaces the "## Switchboard" section of
benchmarks/RESULTS.md. Targets (issue 21, quiet 2-core machine): (a) <= 0.3 s, (b) <= 0.6 s median, and
(b) <= 2x the core time of the same switch.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from benchmarks.results import write_section  # noqa: E402
from tests.browser import DEEP_JS, chromium_page, run_app  # noqa: E402

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


def measure(clicks: int) -> dict:
    import core
    from core.decoding.policies import policy_from_record
    from core.decoding.takeover import flipped, set_switches
    from core.io.store import TraceStore

    tmp = Path(tempfile.mkdtemp(prefix="bench_app_"))
    store_dir = tmp / "store"
    first, full, page_done, alone, positions = [], [], [], [], []
    with run_app(["--store", str(store_dir)], tmp / "streamlit.log") as url:
        with chromium_page(tmp / "profile", viewport={"width": 1440, "height": 1400}) as page:
            page.goto(url)
            page.locator(".fp-scroll [data-pos]").first.wait_for()
            page.wait_for_function("() => window.location.search.includes('trace=')")
            page.wait_for_timeout(1000)
            root_key = _key(page)
            root = TraceStore(store_dir).get(root_key)
            base = [p for p in range(len(root)) if root.source[p] == "base"]
            step = max(1, len(base) // clicks)
            positions = base[::step][:clicks]
            for pos in positions:
                page.evaluate(WATCH, root_key)
                page.locator(f'.fp-scroll [data-pos="{pos}"]').click()
                a_ms, b_ms, c_ms = page.evaluate("() => window.__fpWatch")
                first.append(a_ms / 1000)
                full.append(b_ms / 1000)
                page_done.append(c_ms / 1000)
                page.locator("body").press("b")
                page.wait_for_function("(k) => window.location.search.includes('trace=' + k)", arg=root_key)
                page.wait_for_timeout(400)
    import torch

    torch.set_num_threads(1)  # as the app runs the demo pair (app/resources.load_pair)
    pair = core.demo_pair()
    for pos in positions:  # the same switches, core alone (the parent's caches are not held here: a prefill)
        t0 = time.perf_counter()
        set_switches(pair, root, flipped(root, pos))
        alone.append(time.perf_counter() - t0)
    # and with the parent's caches held, as the app holds the traces it made: the root made again here
    s = root.meta.get("sampling") or {}
    again = core.generate(pair, root.meta["problem"], policy_from_record(root.meta["policy"]), k=root.k,
                          max_new_tokens=int(s["max_new_tokens"]), temperature=float(s.get("temperature", 0.0)),
                          top_p=float(s.get("top_p", 1.0)), seed=int(s.get("seed", 0)))
    held = []
    for pos in positions if again.key == root.key else []:
        t0 = time.perf_counter()
        set_switches(pair, again, flipped(again, pos))
        held.append(time.perf_counter() - t0)
    return {"positions": positions, "first": first, "full": full, "page": page_done, "alone": alone,
            "held": held, "n_tokens": len(root)}


def report(r: dict) -> str:
    med = statistics.median
    lines = [
        f"{len(r['positions'])} clicks on a {r['n_tokens']}-token demo trace (positions {r['positions']}); "
        f"{platform.processor() or platform.machine()}, {platform.python_version()}.",
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
    if r["held"]:
        lines.append(f"| the same, the parent's caches held (as in the app) | {med(r['held']):.3f} s | "
                     f"{max(r['held']):.3f} s |")
    core_s = min(med(r["alone"]), med(r["held"])) if r["held"] else med(r["alone"])
    lines += [
        "",
        f"(b) / core: {med(r['full']) / core_s:.2f}× (median over the faster core median).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clicks", type=int, default=10)
    parser.add_argument("--write", action="store_true", help="replace the section in benchmarks/RESULTS.md")
    args = parser.parse_args()
    text = report(measure(args.clicks))
    print(text)
    if args.write:
        command = f"    .venv/bin/python benchmarks/bench_app.py --clicks {args.clicks} --write"
        write_section(SECTION, f"{SECTION}\n\n{command}\n\n{text}")


if __name__ == "__main__":
    main()
