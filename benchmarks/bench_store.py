"""Benchmark: TraceStore.summaries() versus reading every trace fully, on N small fake traces.

    .venv/bin/python benchmarks/bench_store.py --n 10000 --tokens 64

Prints the timings and the ratio (full read / summaries). Writes into a temporary directory unless
--dir is given (an existing store there is reused, so a second run skips the writing).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fakes import make_trace  # noqa: E402

from core.store import TraceStore  # noqa: E402
from core.trace import request_key  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="number of traces")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per trace")
    parser.add_argument("--dir", type=Path, default=None, help="store directory (default: a temp dir)")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-store-"))
    store = TraceStore(root)
    have = len(store.keys())
    if have < args.n:
        secs = fill(store, args.n - have, args.tokens)
        print(f"put {args.n - have} traces of {args.tokens} tokens: {secs:.1f} s ({1e3 * secs / (args.n - have):.2f} ms each)")
    print(f"store: {root} ({len(store.keys())} traces)")

    def timed(fn):  # (wall s, cpu s): the machine may be shared, CPU time is the steadier number
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - wall, time.process_time() - cpu

    cold = min((timed(lambda: TraceStore(root).summaries()) for _ in range(3)), key=lambda t: t[1])
    warm_store = TraceStore(root)
    warm_store.summaries()
    warm = min((timed(warm_store.summaries) for _ in range(3)), key=lambda t: t[1])
    rows = len(warm_store.summaries())
    print(f"summaries() cold (new TraceStore, parses the index): wall {cold[0]:.3f} s, cpu {cold[1]:.3f} s; rows {rows}")
    print(f"summaries() warm (same TraceStore, index cached):    wall {warm[0]:.3f} s, cpu {warm[1]:.3f} s")

    reader = TraceStore(root)
    full = timed(lambda: [reader.get(key) for key in reader.keys()])
    print(f"get() every trace:                                   wall {full[0]:.2f} s, cpu {full[1]:.2f} s")
    print(f"ratio full read / summaries(): cold {full[1] / cold[1]:.0f}x, warm {full[1] / warm[1]:.0f}x (cpu time)")


if __name__ == "__main__":
    main()
