"""A flip that changes no token (issue 31): decided without decoding, against deciding it after decoding and
against what a flip did before (decode and make a new child with the same text).

    .venv/bin/python benchmarks/bench_noop.py                # demo pair, up to 10 no-op positions, 3 repeats

The demo pair writes a greedy Guided-free base trace (BaseOnly) of its first test problem; the positions are
those where the reasoner's top token is the emitted one (`flip_changes` leaves them out), so a flip there
writes the same token and the base writes on as before. Three ways per position, interleaved:
cheap = `set_switches(flipped)` as the switchboard calls it now (the parent comes back without a forward);
decode = the same with the cheap decision switched off (decode, compare, give the parent);
before = decode and assemble a new child (what every such click did). CPU seconds of this one-thread
process, medians over positions x repeats. The machine is shared with other agents: ratios, not seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import core
import core.decoding.takeover as tk
from core.decoding.takeover import _child, child_sampling, decode_children, flipped, resolve_then, set_switches
from core.views.presentation import flip_changes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pair = core.demo_pair()
    trace = core.generate(pair, core.demo_problems(limit=1)[0], max_new_tokens=80)
    changes = set(flip_changes(trace))
    todo = [p for p in range(len(trace)) if p not in changes][: args.positions]
    plan = resolve_then(trace, "policy")
    sampling = child_sampling(trace)
    real = tk._same_as_parent
    times: dict[str, list[float]] = {"cheap": [], "decode": [], "before": []}
    for _ in range(args.repeats):
        for p in todo:
            t0 = time.process_time()
            got = set_switches(pair, trace, flipped(trace, p))
            times["cheap"].append(time.process_time() - t0)
            assert got is trace
            tk._same_as_parent = lambda *a: False
            try:
                t0 = time.process_time()
                got = set_switches(pair, trace, flipped(trace, p))
                times["decode"].append(time.process_time() - t0)
            finally:
                tk._same_as_parent = real
            assert got is trace
            t0 = time.process_time()
            kid = decode_children(pair, trace, [_child(pair, trace, p, flipped(trace, p), plan, sampling)], plan,
                                  sampling)[0]
            times["before"].append(time.process_time() - t0)
            assert kid.token_ids.tolist() == trace.token_ids.tolist() and kid is not trace
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"demo pair, trace of {len(trace)} tokens, {len(todo)} no-op positions x {args.repeats} repeats "
          f"({len(changes)} positions where a flip changes the text)")
    for k in ("cheap", "decode", "before"):
        print(f"  {k:7s} median {med[k] * 1e3:8.2f} ms CPU (min {min(times[k]) * 1e3:.2f}, max {max(times[k]) * 1e3:.2f})")
    print(f"  before / cheap = {med['before'] / med['cheap']:.0f}x   before / decode = {med['before'] / med['decode']:.2f}x")


if __name__ == "__main__":
    main()
