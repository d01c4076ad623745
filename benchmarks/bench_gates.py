"""The gate shoot-out's targets (issue 32), measured side by side in one run on the demo pair (CPU):

- each gate's realised ρ within ±25% of its target on held-out problems;
- the learned gate's recovery at ρ = 0.05 at least the entropy gate's;
- the learned gate's wall time per token ≤ 0.6× Guided's at the same ρ;
- the reasoner's evaluations per token for every gate.

    python benchmarks/bench_gates.py --out DIR [--limit 100 --samples 4 --ratios 0.02,0.05,0.1 --batch-size B]
    python benchmarks/bench_gates.py --from DIR      # the checks on a finished `forkpoint gates --out DIR`
    python benchmarks/bench_gates.py --interleaved 3 [--batch-size B]   # wall per token side by side, in process

The run is `forkpoint gates` (the demo test set, the demo calibration set held out, a router trained on the
calibration rollouts); wall times depend on the machine's load.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd


def checks(table: pd.DataFrame, focus: float = 0.05) -> list[str]:
    """Lines: realised / target ρ per gate, the router against the entropy gate and Guided, reasoner evaluations."""
    rows = table[table["target_rho"].notna()]
    rec = "recovery@k" if rows["recovery@k"].notna().any() else "recovery"
    out = [f"{'gate':<24} {'target':>7} {'calibrated':>10} {'realised':>9} {'ratio':>6} {'±25%':>5} "
           f"{rec:>10} {'w->r':>5} {'r->w':>5} {'reason/token':>12} {'fwd/token':>9} {'wall s/token':>12}"]
    for _, r in rows.iterrows():
        ratio = r["rho"] / r["target_rho"]
        out.append(f"{r['label']:<24} {r['target_rho']:>7.3f} {r['calibrated_rho']:>10.4f} {r['rho']:>9.4f} "
                   f"{ratio:>6.2f} {'yes' if abs(ratio - 1) <= 0.25 else 'NO':>5} {r[rec]:>10.3f} "
                   f"{int(r['wrong_to_right']):>5} {int(r['right_to_wrong']):>5} {r['reason_evals_per_token']:>12.4f} "
                   f"{r.get('reason_forwards_per_token', math.nan):>9.4f} {r['wall_s_per_token']:>12.5f}")

    def get(gate: str, rho: float, col: str) -> float:
        hit = rows[(rows["gate"] == gate) & (rows["target_rho"].round(6) == round(rho, 6))]
        return float(hit[col].iloc[0]) if len(hit) else math.nan

    for rho in sorted(set(rows["target_rho"])):
        router, guided = get("router", rho, "wall_s_per_token"), get("guided", rho, "wall_s_per_token")
        out.append(f"ρ={rho:g}: router wall / Guided wall = {router / guided:.2f} (target ≤ 0.6); router {rec} "
                   f"{get('router', rho, rec):.3f} vs entropy_gated {get('entropy_gated', rho, rec):.3f}"
                   + (" (target: ≥)" if rho == focus else ""))
    base = table[table["label"] == "base"]["wall_s_per_token"]
    if len(base) and math.isfinite(float(base.iloc[0])):  # the floor of a lazy gate: the base decodes every token
        floor = float(base.iloc[0])
        out.append(f"base alone (BaseOnly) wall s/token {floor:.5f}: base / Guided wall = "
                   + ", ".join(f"{floor / get('guided', rho, 'wall_s_per_token'):.2f} (ρ={rho:g})"
                               for rho in sorted(set(rows["target_rho"]))))
    inside = sum(abs(r["rho"] / r["target_rho"] - 1) <= 0.25 for _, r in rows.iterrows())
    out.append(f"realised ρ within ±25% of target: {inside} of {len(rows)} gate x ρ rows")
    return out


def interleaved(repeats: int, batch_size: int | None, limit: int = 16, rho: float = 0.05) -> list[str]:
    """Wall per token of BaseOnly, Guided, EntropyGated and the router at `rho` on the same demo problems, the
    policies alternating (order reversed every repeat), one torch thread; the router's own per-step time (its
    `takeover`: features and forward) beside it. Ratios are medians of the per-repeat ratios."""
    import statistics
    import tempfile
    import time

    import torch

    import core
    from core.decoding import generate_many
    from core.decoding.calibration import build_policy
    from core.decoding.policies import BaseOnly

    torch.set_num_threads(1)
    pair = core.demo_pair()
    kw = dict(max_new_tokens=96, temperature=0.6, top_p=0.95, seed=1, batch_size=batch_size or 8)
    rollouts = generate_many(pair, core.demo_problems("calib", limit=48), BaseOnly(), **kw)
    folder = tempfile.mkdtemp(prefix="bench-gates-router-")
    core.train_router(pair, rollouts, "gate", out=folder, seed=1)
    policies = {"base": BaseOnly(), **{g: build_policy(pair, g, {"path": folder} if g == "router" else None, rho=rho,
                                                        rollouts=rollouts, max_new_tokens=96)
                                       for g in ("guided", "entropy_gated", "router")}}
    spent = [0.0, 0]
    decide = policies["router"].takeover

    def timed(step):  # the router's own work per step, measured inside the run
        t0 = time.perf_counter()
        out = decide(step)
        spent[0] += time.perf_counter() - t0
        spent[1] += 1
        return out

    policies["router"].takeover = timed
    problems = core.demo_problems("test", limit=limit)
    walls: dict[str, list[float]] = {g: [] for g in policies}
    router_s = 0.0
    for rep in range(repeats):
        for g in (list(policies) if rep % 2 == 0 else list(policies)[::-1]):
            t0 = time.perf_counter()
            made = generate_many(pair, problems, policies[g], **kw)
            seconds = time.perf_counter() - t0
            walls[g].append(seconds / sum(len(t) for t in made))
            router_s += seconds if g == "router" else 0.0
    ratio = {g: statistics.median(a / b for a, b in zip(walls[g], walls["guided"])) for g in policies}
    out = [f"in process, {limit} demo test problems, batch_size {kw['batch_size']}, rho {rho:g}, {repeats} repeats, "
           "1 torch thread: wall ms/token (median) and / Guided (median of per-repeat ratios)"]
    out += [f"{g:<14} {1e3 * statistics.median(walls[g]):8.3f} ms/token  {ratio[g]:5.2f}x Guided" for g in policies]
    out.append(f"router takeover (features + forward): {1e3 * spent[0] / max(1, spent[1]):.3f} ms per step over "
               f"{spent[1]} steps, {spent[0]:.3f} s of the router runs' {router_s:.2f} s")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="source", help="A finished `forkpoint gates --out DIR` to check")
    ap.add_argument("--out", help="Run `forkpoint gates` into this folder first")
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--ratios", default="0.02,0.05,0.1")
    ap.add_argument("--batch-size", type=int, default=None, help="Rows decoded together (default: forkpoint's)")
    ap.add_argument("--interleaved", type=int, default=0, metavar="REPEATS",
                    help="Instead: time BaseOnly, Guided, EntropyGated and the router side by side in process")
    args = ap.parse_args()
    if args.interleaved:
        print("\n".join(interleaved(args.interleaved, args.batch_size)))
        return
    folder = args.source or args.out
    if folder is None:
        ap.error("give --out DIR (run) or --from DIR (check a run)")
    if args.source is None:
        cmd = [sys.executable, "-m", "core.cli", "gates", "--ratios", args.ratios, "--samples", str(args.samples),
               "--limit", str(args.limit), "--max-new-tokens", "96", "--temperature", "0.6", "--top-p", "0.95",
               "--out", folder, "--store", str(Path(folder) / "store")]
        cmd += [] if args.batch_size is None else ["--batch-size", str(args.batch_size)]
        subprocess.run(cmd, check=True)
    table = pd.read_csv(Path(folder) / "gates.csv")
    bench = table[table["benchmark"] == "average"] if (table["benchmark"] == "average").any() else table
    print("\n".join(checks(bench)))


if __name__ == "__main__":
    main()
