"""What a user waits for, measured in Chromium against `streamlit run app/main.py` on the demo pair, and the
start-up of the file-only CLI commands (issue 22's speed targets on a quiet machine):

- row → trace: a click on a Problems table row until the Trace page's tokens are drawn (≤ 1.5 s)
- cold shared URL: a fresh browser profile opening `?trace=…&pos=…` until the tokens are drawn (≤ 3 s)
- Dataset tab switch: a click on another tab of the Dataset page until its run has finished (≤ 1 s)
- `forkpoint export` of one trace (≤ 1 s) and `forkpoint ls` (≤ 0.5 s), wall time of the process

    .venv/bin/python benchmarks/bench_journeys.py [--repeat 3] [--write]

--write replaces the "## Journeys" section of benchmarks/RESULTS.md. Medians of --repeat runs after one
warm-up (the app's caches warm, as a user's second visit); the cold URL is timed on a fresh profile each time.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from benchmarks.results import write_section  # noqa: E402
from tests.browser import chromium_page, run_app  # noqa: E402

SECTION = "## Journeys"
TARGETS = {"row → trace": 1.5, "cold shared URL": 3.0, "Dataset tab switch": 1.0, "forkpoint export (1 trace)": 1.0,
           "forkpoint ls": 0.5}  # fmt: skip
IDLE_JS = """() => !document.querySelector('[data-testid="stStatusWidget"]') &&
  ![...document.querySelectorAll('[data-testid="stToolbar"] button, header button')]
    .some(b => /^(Stop|Running)/.test(b.innerText.trim()))"""
TOKENS = ".fp-scroll [data-pos]"


def _idle(page) -> None:
    page.wait_for_timeout(150)
    page.wait_for_function(IDLE_JS, timeout=120_000)


def _row_to_trace(page, url: str) -> float:
    page.goto(f"{url}problems")
    grid = page.locator('.st-key-problems_traces [data-testid="stDataFrame"]').first
    grid.wait_for()
    _idle(page)
    page.wait_for_timeout(800)  # the grid draws its rows after the run
    box = grid.bounding_box()
    t0 = time.perf_counter()
    page.mouse.click(box["x"] + 18, box["y"] + 35 + 17)
    page.wait_for_function("() => location.pathname.endsWith('/') || location.pathname.endsWith('/trace')")
    page.locator(TOKENS).first.wait_for(timeout=120_000)
    return time.perf_counter() - t0


def _dataset_tab(page, url: str) -> float:
    page.goto(f"{url}dataset")
    tabs = page.get_by_role("tab")
    tabs.first.wait_for()
    _idle(page)
    names = [tabs.nth(i).inner_text() for i in range(tabs.count())]
    other = next(i for i in range(1, len(names)))
    t0 = time.perf_counter()
    tabs.nth(other).click()
    _idle(page)
    return time.perf_counter() - t0


def _cold_url(link: str) -> float:
    with tempfile.TemporaryDirectory() as profile, chromium_page(Path(profile), {"width": 1440, "height": 1600}) as page:
        t0 = time.perf_counter()
        page.goto(link)
        page.locator(TOKENS).first.wait_for(timeout=120_000)
        return time.perf_counter() - t0


def _cli(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "core.cli", *args], check=True, capture_output=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - t0


def measure(repeat: int) -> dict[str, list[float]]:
    """Seconds per journey, `repeat` runs each after a warm-up."""
    out: dict[str, list[float]] = {name: [] for name in TARGETS}
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        log = Path(tmp) / "streamlit.log"
        with run_app(["--store", str(store)], log, env={"OMP_NUM_THREADS": "1"}) as url:
            with chromium_page(Path(tmp) / "profile", {"width": 1440, "height": 1600}) as page:
                page.goto(url)
                page.locator(TOKENS).first.wait_for(timeout=300_000)  # the first view makes the demo traces
                page.wait_for_function("() => location.search.includes('trace=')", timeout=120_000)
                _idle(page)
                link = page.url
                for i in range(repeat + 1):
                    row = _row_to_trace(page, url)
                    tab = _dataset_tab(page, url)
                    if i:
                        out["row → trace"].append(row)
                        out["Dataset tab switch"].append(tab)
            _cold_url(link)  # warm the server's caches for this trace
            out["cold shared URL"] = [_cold_url(link) for _ in range(repeat)]
        key = re.search(r"trace=([0-9a-f]+)", link).group(1)
        target = Path(tmp) / "one.html"
        _cli(["ls", "--store", str(store)])
        out["forkpoint ls"] = [_cli(["ls", "--store", str(store)]) for _ in range(repeat)]
        out["forkpoint export (1 trace)"] = [_cli(["export", key, "--store", str(store), "--out", str(target),
                                                   "--overwrite"]) for _ in range(repeat)]
    return out


def report(times: dict[str, list[float]], repeat: int) -> str:
    load = os.getloadavg()[0]
    lines = [SECTION, "",
             f"`.venv/bin/python benchmarks/bench_journeys.py --repeat {repeat} --write` (demo pair, Chromium headless, "
             f"medians of {repeat}; {platform.python_implementation()} {platform.python_version()}, "
             f"{os.cpu_count()} CPUs, load average {load:.1f} when measured)", "", "```",
             f"{'journey':<28}{'median s':>10}{'target s':>10}  met"]
    for name, target in TARGETS.items():
        med = statistics.median(times[name]) if times[name] else float("nan")
        lines.append(f"{name:<28}{med:>10.2f}{target:>10.2f}  {'yes' if med <= target else 'no'}")
    lines += ["```", "",
              "The targets are for a quiet machine; a load average above the CPU count stretches every number. "
              "`ls` and `export` start without torch or transformers (tests/test_cli.py checks it); "
              "a graded trace carries its planning tags, so `export` loads no spaCy either (below)."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="replace the Journeys section of RESULTS.md")
    args = parser.parse_args()
    text = report(measure(args.repeat), args.repeat)
    print(text)
    if args.write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
