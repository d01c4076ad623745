"""Benchmark: TraceStore.summaries() versus reading every trace fully, on N small fake traces.

    .venv/bin/python benchmarks/bench_store.py --n 10000 --tokens 64 [--dir DIR] [--write]

Prints the timings and the ratio (full read / summaries), in wall and CPU seconds (CPU time is the
steadier number on a shared machine). Writes into a temporary directory unless --dir is given (an
existing store there is reused, so a second run skips the writing). --write replaces the "## Store"
section of benchmarks/RESULTS.md (other sections untouched).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fakes import make_trace  # noqa: E402

from benchmarks.results import write_section  # noqa: E402
from core.io.maintenance import verify
from core.io.store import TraceStore  # noqa: E402
from core.trace import request_key  # noqa: E402

SECTION = "## Store"


def fill(store: TraceStore, n: int, tokens: int, distinct: int = 64) -> float:
    """Put n traces (metrics reused from `distinct` fakes, meta unique per trace); returns seconds."""
    bases = [make_trace(tokens, seed=s, annotate=True) for s in range(distinct)]
    start = time.perf_counter()
    for i in range(n):
        base = bases[i % distinct]
        request = {**base.meta["request"], "copy": i}
        problem = {**base.meta["problem"], "id": f"p{i}"}
        trace = base.annotate()
        trace.meta.update(request=request, problem=problem, key=request_key(request))
        store.put(trace)
    return time.perf_counter() - start


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall s, cpu s) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _held_bytes(root: Path) -> tuple[int, int]:
    """Python-allocated bytes a fresh TraceStore still holds after listing (tracemalloc; the frame dropped): with its
    kept listing (TraceStore._summary_rows), and without it (what the index holds)."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        store = TraceStore(root)
        store.summaries()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        store._listed = None
        gc.collect()
        index_held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del store
    return held, index_held


def _import_read_timing(n: int = 100_000) -> str:
    """Reading a foreign JSONL (the importer's limits and checks, no scoring): records per second."""
    import json

    from core.io.foreign import iter_foreign

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.jsonl"
        with open(path, "w", encoding="utf-8") as fh:
            for i in range(n):
                fh.write(json.dumps({"id": i, "prompt": f"What is {i} + {i}?", "response": f"It is {2 * i}. " * 8,
                                     "answer": str(2 * i)}) + "\n")  # fmt: skip
        wall, cpu = timed(lambda: sum(1 for _ in iter_foreign(path)))
    return f"import: reading + checking {n} foreign JSONL records: {wall:.2f} s wall ({n / wall:,.0f} records/s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="number of traces")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per trace")
    parser.add_argument("--dir", type=Path, default=None, help="store directory (default: a temp dir)")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    parser.add_argument("--rebuild", action="store_true", help="also time a listing after deleting the index")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-store-"))
    store = TraceStore(root)
    lines: list[str] = []
    have = len(store.keys())
    if have < args.n:
        secs = fill(store, args.n - have, args.tokens)
        each = 1e3 * secs / (args.n - have)
        lines.append(f"put {args.n - have} traces: {secs:.1f} s wall ({each:.1f} ms each, fsync included)")
    n = len(store.keys())

    cold = min((timed(lambda: TraceStore(root).summaries()) for _ in range(3)), key=lambda t: t[1])
    warm_store = TraceStore(root)
    warm_store.summaries()
    warm = min((timed(warm_store.summaries) for _ in range(3)), key=lambda t: t[1])
    keys = TraceStore(root).keys()
    resume_store = TraceStore(root)
    resume_store.summary(keys[0])  # reads the index once
    each = timed(lambda: [resume_store.summary(key) for key in keys])  # the driver's resume: one key at a time
    held, index_held = _held_bytes(root)
    reader = TraceStore(root)
    full = timed(lambda: [reader.get(key) for key in reader.keys()])
    check = timed(lambda: verify(TraceStore(root)))
    some = TraceStore(root).keys()[:200]
    again = timed(lambda: [reader.put(reader.get(key)) for key in some])
    lines += [
        f"summaries(), new TraceStore (parses index.jsonl): {cold[0]:.3f} s wall, {cold[1]:.3f} s CPU",
        f"summaries(), same TraceStore (its kept listing): {warm[0]:.3f} s wall, {warm[1]:.3f} s CPU",
        (f"summary(key) of every key (a resume), index read: {each[0]:.3f} s wall, {each[1]:.3f} s CPU "
         f"({1e6 * each[0] / n:.0f} µs each)"),
        f"Python memory the index holds after summaries():  {index_held / 2**20:.1f} MiB ({index_held / n:,.0f} B per trace)",
        f"... and the store's kept listing (summaries() again): {(held - index_held) / 2**20:.1f} MiB ({(held - index_held) / n:,.0f} B per trace)",
        f"get() of every trace:                             {full[0]:.2f} s wall, {full[1]:.2f} s CPU",
        f"verify() (deep check of every file):              {check[0]:.2f} s wall, {check[1]:.2f} s CPU",
        f"put() of an already stored trace:                 {1e3 * again[0] / len(some):.2f} ms wall each",
        f"ratio full read / summaries(): {full[1] / cold[1]:.0f}x cold, {full[1] / warm[1]:.0f}x warm (CPU time)",
    ]
    if args.rebuild:  # the index lost: every file is read in full (checksums) before it is listed again
        reader.index_path.unlink()
        rebuild = timed(lambda: TraceStore(root).summaries())
        lines.append(f"summaries() with the index deleted (rebuilds it): {rebuild[0]:.2f} s wall, {rebuild[1]:.2f} s CPU")
    lines.append(_import_read_timing())
    text = "\n".join(
        [
            SECTION,
            "",
            f"`.venv/bin/python benchmarks/bench_store.py --n {args.n} --tokens {args.tokens}"
            f"{' --rebuild' if args.rebuild else ''}` "
            f"({n} traces of {args.tokens} tokens, top-5, annotated; Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} while measuring)",
            "",
            "```",
            *lines,
            "```",
            "",
            "summaries() reads only the append-only index (one short JSON line per write with a CRC, checked",
            "against each file's inode/size/mtime) and never a token column; a file the index does not",
            "describe is read in full (page and footer checksums) before it is listed, once.",
        ]
    )
    print(text)
    if args.write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
