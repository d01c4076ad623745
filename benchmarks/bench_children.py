"""Benchmark: the children of many traces, one `TraceStore.children` call each against one `children_index`.

    .venv/bin/python benchmarks/bench_children.py --n 5000 --asked 2000 [--dir DIR]

Each `children` call lists the store (a stat of every file, how a change is noticed), so asking for the children
of the Dataset page's 2,000 selected traces listed the store 2,000 times. Prints both timings (CPU seconds, the
steadier number here) and their ratio, and checks that both give the same children. Writes a store of `--n` fake
traces (a tenth of them branches) into a temporary folder unless --dir names one (reused when it exists).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fakes import make_trace  # noqa: E402

from benchmarks.results import host  # noqa: E402
from core.io.store import TraceStore  # noqa: E402
from core.trace import request_key  # noqa: E402


def fill(store: TraceStore, n: int) -> list[str]:
    """n small fake traces, every tenth a branch of the trace before it; their keys in order."""
    base, keys = make_trace(16, seed=0), []
    for i in range(n):
        request = {**base.meta["request"], "copy": i}
        branch = {"parent": keys[-1], "branch_pos": 3, "kind": "branch"} if i % 10 == 9 else {}
        trace = base.annotate()
        trace.meta.update(request=request, key=request_key(request), **branch)
        keys.append(store.put(trace))
    return keys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5000, help="traces in the store")
    ap.add_argument("--asked", type=int, default=2000, help="traces whose children are asked for")
    ap.add_argument("--dir", help="store folder (default: a temporary one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = TraceStore(args.dir or tmp)
        keys = store.keys() if len(store.keys()) >= args.n else fill(store, args.n)
        asked = sorted(keys)[: args.asked]
        store.summaries()  # both start from a kept listing
        t = time.process_time()
        one_by_one = {k: store.children(k) for k in asked}
        per_key = time.process_time() - t
        t = time.process_time()
        index = store.children_index()
        at_once = {k: index.get(k, []) for k in asked}
        indexed = time.process_time() - t
    assert one_by_one == at_once, "the index and the per-key children differ"
    print(f"{host()}")
    print(f"children of {len(asked)} traces in a store of {len(keys)}: one call each {per_key:.3f} CPU s, "
          f"one index {indexed:.4f} CPU s, ratio {per_key / max(indexed, 1e-9):.0f}x; "
          f"{sum(map(len, at_once.values()))} children, the same either way")


if __name__ == "__main__":
    main()
