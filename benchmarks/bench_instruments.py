"""Cost of the research instruments: `takeover_effects` per position against one continuation, and
`lens` against one forward.

    .venv/bin/python benchmarks/bench_instruments.py                 # demo pair, 8 samples per arm
    .venv/bin/python benchmarks/bench_instruments.py --samples 16 --repeats 7 --write

The demo pair (4 layers, hidden 128, vocabulary 512) writes a greedy base trace for a problem it gets
wrong; at its `--positions` positions (default: 3 spread over the response, the plan token among them):

- effects: one `takeover_effects` position = 2 x samples continuations decoded in ONE batch, against
  one continuation alone (`_continue` with one row), and against 2 x samples continuations one by one
  (what batching saves). No store, so nothing is read back.
- lens: `lens(pair, trace, pos, window=0)` against one forward of both models over prompt + prefix up
  to pos with the head at the last position (what any read of one position's distribution costs).

CPU seconds of this one-thread process (steadier than wall time on a shared machine), medians over
interleaved repeats after one warm-up.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import core
from core.instruments import effects as fx
from core.instruments.lens import lens
from core.pair.forward import backbone, head

SECTION = "## Research instruments: effects and lens"


def _cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def one_forward(pair: core.ModelPair, trace: core.Trace, pos: int) -> None:
    """Both models over prompt + the first pos tokens, head at the last position (no cache kept)."""
    for side in ("base", "reason"):
        ids = torch.tensor([trace.prompt_ids[side] + trace.token_ids[:pos].tolist()])
        hidden, _ = backbone(pair.model(side), ids)
        head(pair.model(side), hidden[:, -1], pair.vocab_size)


def one_round(pair: core.ModelPair, trace: core.Trace, pos: int, seeds: list[int], n: int) -> dict[str, float]:
    """CPU seconds of each measured call at `pos`, once."""
    return {
        "position": _cpu(lambda: fx.takeover_effects(pair, trace, [pos], n, temperature=0.6)),
        "one": _cpu(lambda: fx._continue(pair, trace, pos, ["reason"], seeds[:1], temperature=0.6)),
        "serial": _cpu(lambda: [fx._continue(pair, trace, pos, [w], [s], temperature=0.6)
                                for w in ("reason", "base") for s in seeds]),
        "lens": _cpu(lambda: lens(pair, trace, pos)),
        "forward": _cpu(lambda: one_forward(pair, trace, pos)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=8, help="continuations per arm (2 arms per position)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--positions", type=str, default=None, help="comma-separated positions (default: 3 spread)")
    ap.add_argument("--write", action="store_true", help="write the section of benchmarks/RESULTS.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    pair = core.demo_pair()
    trace = core.generate(pair, core.demo_problems(limit=2)[1], max_new_tokens=96)
    plan = int(trace.metrics["cross_entropy"].argmax())
    positions = [int(p) for p in args.positions.split(",")] if args.positions else [3, plan, len(trace) - 12]
    n = args.samples
    rows = []
    for pos in positions:
        seeds = fx.sample_seeds(0, pos, n)
        t = {"position": [], "one": [], "serial": [], "lens": [], "forward": []}
        for rep in range(args.repeats + 1):
            times = one_round(pair, trace, pos, seeds, n)
            if rep:  # the first round warms up
                for name, value in times.items():
                    t[name].append(value)
        med = {name: statistics.median(v) for name, v in t.items()}
        rows.append((pos, med))
    lines = [(f"{'pos':>4} {'effects/pos s':>13} {'one cont. s':>11} {'ratio':>6} {'2n one by one s':>15} "
              f"{'batch gain':>10} {'lens s':>8} {'forward s':>9} {'ratio':>6}")]
    for pos, m in rows:
        lines.append(f"{pos:>4} {m['position']:>13.3f} {m['one']:>11.4f} {m['position'] / m['one']:>6.1f} "
                     f"{m['serial']:>15.3f} {m['serial'] / m['position']:>9.1f}x {m['lens']:>8.4f} "
                     f"{m['forward']:>9.4f} {m['lens'] / m['forward']:>6.1f}")
    table = "\n".join(lines)
    print(table)
    if args.write:
        from results import write_section

        cmd = "`.venv/bin/python benchmarks/bench_instruments.py" + (f" --samples {n}" if n != 8 else "") + \
              (f" --repeats {args.repeats}" if args.repeats != 5 else "") + " --write`"
        text = (f"{SECTION}\n\n{cmd} (demo pair, greedy base trace of {len(trace)} tokens, {n} samples per arm at "
                f"T 0.6; CPU seconds of one thread, medians of {args.repeats}; Python {platform.python_version()}, "
                f"torch {torch.__version__})\n\n```\n{table}\n```\n\n"
                "effects/pos: one `takeover_effects` position (2 x samples continuations in one batch, graded); "
                "one cont.: a single continuation alone; ratio = effects/pos / one cont. (the 2 x samples rows "
                "would cost that many times one continuation unbatched: see the one-by-one column and the "
                "batch gain). lens: `lens(pair, trace, pos)` (both models, every layer, top-k and ranks); "
                "forward: both models over prompt + prefix with the head at the last position; ratio = lens / forward.")
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
