"""The gate shoot-out's targets (issue 32), measured side by side in one run on the demo pair (CPU):

- each gate's realised ρ within ±25% of its target on held-out problems;
- the learned gate's recovery at ρ = 0.05 at least the entropy gate's;
- the learned gate's wall time per token ≤ 0.6× Guided's at the same ρ;
- the reasoner's evaluations per token for every gate.

    python benchmarks/bench_gates.py --out DIR [--limit 100 --samples 4 --ratios 0.02,0.05,0.1]
    python benchmarks/bench_gates.py --from DIR      # the checks on a finished `forkpoint gates --out DIR`

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="source", help="A finished `forkpoint gates --out DIR` to check")
    ap.add_argument("--out", help="Run `forkpoint gates` into this folder first")
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--ratios", default="0.02,0.05,0.1")
    args = ap.parse_args()
    folder = args.source or args.out
    if folder is None:
        ap.error("give --out DIR (run) or --from DIR (check a run)")
    if args.source is None:
        cmd = [sys.executable, "-m", "core.cli", "gates", "--ratios", args.ratios, "--samples", str(args.samples),
               "--limit", str(args.limit), "--max-new-tokens", "96", "--temperature", "0.6", "--top-p", "0.95",
               "--out", folder, "--store", str(Path(folder) / "store")]
        subprocess.run(cmd, check=True)
    table = pd.read_csv(Path(folder) / "gates.csv")
    bench = table[table["benchmark"] == "average"] if (table["benchmark"] == "average").any() else table
    print("\n".join(checks(bench)))


if __name__ == "__main__":
    main()
