"""Benchmark: an analysis report over a large store, nothing kept against `report_keep_gib`'s default.

    .venv/bin/python benchmarks/bench_report.py [--n 1500] [--dir DIR] [--repeats 2] [--write]

`forkpoint analyze` runs every registered analysis over `StoredTraces`, and each analysis scans every trace (some
twice or more). With nothing kept (`keep_gib=0`) a trace is read once per scan; with the default, the traces that
fit are read once. Both run on the same store, alternating, and must give the same tables. The store holds
`--n` fake 64-token traces (tests/fakes.py, tagged, as `bench_store.py` writes them; `--dir` reuses one). Prints
wall and CPU seconds, the reads and the ratio. --write replaces the "## Analysis report" section of
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import pandas as pd  # noqa: E402

from benchmarks.bench_store import fill  # noqa: E402
from benchmarks.results import host, write_section  # noqa: E402
from core import settings  # noqa: E402
from core.io.store import TraceStore  # noqa: E402
from core.io.stored_traces import StoredTraces  # noqa: E402
from core.reports.report import report_tables  # noqa: E402

SECTION = "## Analysis report"


def run(store: TraceStore, keep_gib: float) -> tuple[float, float, int, dict[str, pd.DataFrame]]:
    """(wall s, CPU s, trace reads, tables) of one report over every trace of `store`."""
    reads = 0
    get = store.get

    def counted(key: str):
        nonlocal reads
        reads += 1
        return get(key)

    store.get = counted  # type: ignore[method-assign]
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        tables = report_tables(StoredTraces(store, store.keys()), keep_gib=keep_gib)
        return time.perf_counter() - wall, time.process_time() - cpu, reads, tables
    finally:
        del store.get


def measure(root: Path, n: int, repeats: int) -> str:
    store = TraceStore(root)
    if len(store.keys()) < n:
        fill(store, n - len(store.keys()), 64)
    machine = host()
    rows: dict[float, list[tuple[float, float, int]]] = {0.0: [], settings.REPORT_KEEP_GIB: []}
    reference = None
    for r in range(repeats):
        for keep in (rows if r % 2 == 0 else reversed(list(rows))):
            wall, cpu, reads, tables = run(store, keep)
            rows[keep].append((wall, cpu, reads))
            if reference is None:
                reference = tables
            else:
                assert tables.keys() == reference.keys()
                for name in tables:
                    pd.testing.assert_frame_equal(tables[name], reference[name])
    med = {k: (statistics.median(w for w, _, _ in v), statistics.median(c for _, c, _ in v), v[0][2])
           for k, v in rows.items()}
    (w0, c0, r0), (w1, c1, r1) = med[0.0], med[settings.REPORT_KEEP_GIB]
    return "\n".join([
        f"{len(store.keys()):,} traces of 64 tokens; {repeats} runs each, alternating; {machine}.",
        "",
        "| report_tables over StoredTraces | wall s (median) | CPU s (median) | trace reads |",
        "|---|---:|---:|---:|",
        f"| keep_gib=0 (each scan reads every trace) | {w0:.2f} | {c0:.2f} | {r0:,} |",
        f"| keep_gib={settings.REPORT_KEEP_GIB:g} (the default) | {w1:.2f} | {c1:.2f} | {r1:,} |",
        "",
        f"Kept / not kept: {w1 / w0:.2f}x wall, {c1 / c0:.2f}x CPU; the same tables in every run.",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1500, help="traces in the store")
    ap.add_argument("--dir", type=Path, default=None, help="store folder (reused; default: a temporary one)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each, alternating")
    ap.add_argument("--write", action="store_true", help="replace the section in benchmarks/RESULTS.md")
    args = ap.parse_args()
    logging.getLogger("core.reports.report").setLevel(logging.ERROR)  # "recovery skipped": the fakes have no policies
    with tempfile.TemporaryDirectory(prefix="bench_report_") as tmp:
        text = measure(args.dir or Path(tmp) / "store", args.n, args.repeats)
    print(text)
    if args.write:
        command = f"    .venv/bin/python benchmarks/bench_report.py --n {args.n} --repeats {args.repeats} --write"
        write_section(SECTION, f"{SECTION}\n\n{command}\n\n{text}")


if __name__ == "__main__":
    main()
