"""Which takeovers matter (`ablate_takeovers`): all the switched-off variants in one batch against the
same variants one by one (`set_switches` per takeover, what the action did before it was batched).

    .venv/bin/python benchmarks/bench_ablation.py                  # demo pair, 5 interleaved repeats
    .venv/bin/python benchmarks/bench_ablation.py --repeats 7 --write

The demo pair writes Guided traces (gate calibrated at r = --ratio on base rollouts of the demo's
calibration problems) for the first test problems until one has at least --takeovers takeovers. Both
sides grade each child and keep no store (nothing is read back); the tokens of both are checked equal.
CPU seconds of this one-thread process (steadier than wall time on a shared machine) and wall seconds,
medians over interleaved repeats after one warm-up.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import core
from core.decoding.takeover import set_switches
from core.instruments.ablation import ablate_takeovers, ablation_switches
from core.evaluation.grading import graded_put

SECTION = "## Which takeovers matter: batched vs one by one"


def one_by_one(pair: core.ModelPair, trace: core.Trace) -> list[core.Trace]:
    """The action before batching: one `set_switches` per takeover, each child graded."""
    return [graded_put(None, set_switches(pair, trace, w)) for _, w in ablation_switches(trace)]


def timed(fn) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def demo_trace(pair: core.ModelPair, ratio: float, takeovers: int, max_new_tokens: int) -> core.Trace:
    policy = core.build_policy(pair, "guided", calibrate_on=core.demo_problems("calib", limit=8), ratio=ratio,
                               max_new_tokens=max_new_tokens)
    for problem in core.demo_problems(limit=20):
        trace = core.generate(pair, problem, policy, max_new_tokens=max_new_tokens)
        if trace.n_takeovers >= takeovers:
            return trace
    raise SystemExit(f"no demo test problem gave {takeovers} takeovers at r = {ratio}; lower --takeovers")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ratio", type=float, default=0.2, help="the Guided gate's budget ratio r")
    ap.add_argument("--takeovers", type=int, default=5, help="the least takeovers the demo trace must have")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--write", action="store_true", help="write the section of benchmarks/RESULTS.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    pair = core.demo_pair()
    trace = demo_trace(pair, args.ratio, args.takeovers, args.max_new_tokens)
    batch = ablate_takeovers(pair, trace)
    alone = one_by_one(pair, trace)
    assert list(batch["key"]) == [c.key for c in alone], "the batch and the one-by-one children differ"
    t: dict[str, list[tuple[float, float]]] = {"batched": [], "one by one": []}
    for rep in range(args.repeats + 1):
        for name, fn in (("batched", lambda: ablate_takeovers(pair, trace)), ("one by one", lambda: one_by_one(pair, trace))):
            got = timed(fn)
            if rep:  # the first round warms up
                t[name].append(got)
    cpu = {name: statistics.median(c for c, _ in v) for name, v in t.items()}
    wall = {name: statistics.median(w for _, w in v) for name, v in t.items()}
    lines = [f"{'':>11} {'CPU s':>7} {'wall s':>7}"]
    for name in t:
        lines.append(f"{name:>11} {cpu[name]:>7.3f} {wall[name]:>7.3f}")
    lines.append(f"{'ratio':>11} {cpu['batched'] / cpu['one by one']:>7.2f} {wall['batched'] / wall['one by one']:>7.2f}"
                 "   (batched / one by one)")
    table = "\n".join(lines)
    load = os.getloadavg()
    head = (f"demo pair, Guided (r = {args.ratio}) trace of {len(trace)} tokens with {trace.n_takeovers} takeovers "
            f"at {[int(p) for p, _ in ablation_switches(trace)]}; medians of {args.repeats}; load average "
            f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    print(head)
    print(table)
    if args.write:
        from results import write_section

        cmd = "`.venv/bin/python benchmarks/bench_ablation.py" + \
              (f" --repeats {args.repeats}" if args.repeats != 5 else "") + " --write`"
        text = (f"{SECTION}\n\n{cmd} ({head}; one torch thread; Python {platform.python_version()}, "
                f"torch {torch.__version__})\n\n```\n{table}\n```\n\n"
                "batched: `ablate_takeovers(pair, trace)`, every switched-off variant in one decoding batch "
                "(the rows join where their takeover is and share one read of the prefix); one by one: "
                "`set_switches(pair, trace, {p: 'base'})` per takeover, each graded. Same children (keys "
                "checked equal), no store, the parent's caches held for both.")
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
