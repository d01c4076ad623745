"""forkpoint gates: the gate shoot-out, every gate at each equal takeover rate ρ (core/reports/gates.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from core import settings
from core.cli.common import (
    StageBars,
    calibration_option,
    check_output,
    close_executor,
    fail_cleanly,
    float_list,
    free_output,
    gate_rhos_option,
    main,
    make_executor,
    open_store,
    overwrite_option,
    pair_from_options,
    pair_max_new_tokens,
    pair_options,
    pair_or_spec,
    problems_and_calibration,
    ray_option,
    router_folder_option,
    setting_option,
    store_option,
)
from core.errors import InvalidInputError


@main.command()
@pair_options
@store_option
@click.option("--problems", "problems_path", help="Problem source: JSONL/CSV file, hf:<dataset id>[:config][:split], "
              "or a benchmark short name (default: the demo test set).")
@calibration_option("the demo calibration set with the demo test set, else the first --calibration-problems of "
                    "--problems (at most a quarter), which are then not run", in_sample=True)
@setting_option("calibration_problems")
@click.option("--limit", type=click.IntRange(1), help="Use the first N problems.")
@gate_rhos_option(",".join(map(str, settings.GATE_RHOS)), "Comma-separated target takeover rates ρ, each in (0, 1): "
                  "every gate is calibrated to each.", aliases=["--ratios"])  # --ratios: its old spelling
@click.option("--gates", "gate_names", default=None,
              help="Comma-separated gates (default: the shoot-out's whole line-up, core.reports.gates.GATES; an "
                   "unknown name is refused with the list).")
@router_folder_option("A trained router's folder (forkpoint router train). Default: one is trained on the "
                      "calibration rollouts (target gate) into OUT/router.")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Output directory (gates.csv, gates.html, and router/ when one is trained here). A rerun into a "
                   "folder `forkpoint gates` wrote rewrites its files (the run resumes from the store); other files "
                   "of those names are refused without --overwrite, and any other file there is left alone.")
@overwrite_option("a shoot-out file in --out (gates.csv, gates.html, router/)", " and `forkpoint gates` did not "
                  "write it (a rerun rewrites the shoot-out's own files without --overwrite)")
@setting_option("samples")
@setting_option("temperature")
@setting_option("top_p")
@setting_option("max_new_tokens")
@setting_option("seed")
@setting_option("batch_size")
@ray_option
@fail_cleanly
def gates(store_path: str | None, problems_path: str | None, calibration: str | None, calibration_problems: int,
          limit: int | None,
          gate_rhos: str, gate_names: str | None, router_path: str | None, out: str, overwrite: bool, samples: int,
          temperature: float,
          top_p: float, max_new_tokens: int, seed: int, batch_size: int, ray_address: str | None,
          **opts: Any) -> None:
    """The gate shoot-out: every gate at each equal takeover rate ρ (realised ρ, accuracy, pass@k, recovery, flips
    against the base, reasoner evaluations and wall seconds per token); gates.csv and gates.html in --out."""
    # deferred, as in every model command: torch and transformers load only when a command runs (tests/test_cli.py)
    from core.evaluation.harness import to_markdown
    from core.reports.gates import GATES, compare_gates, gate_summary, write_gates

    rho_list = float_list(gate_rhos, "ratio", "--gate-rhos")
    chosen = [g.strip() for g in gate_names.split(",") if g.strip()] if gate_names else list(GATES)
    unknown = [g for g in chosen if g not in GATES]
    if unknown:
        raise click.BadParameter(f"unknown gate {unknown[0]!r}; choose from: {', '.join(GATES)}", param_hint="--gates")
    check_output(out, "--out", folder=True)
    _free_gates_outputs(Path(out), overwrite, router="router" in chosen and router_path is None)
    store = open_store(store_path)
    check_output(store.path, "--store", folder=True)
    problems, calibration_set = problems_and_calibration(problems_path, calibration, limit, calibration_problems)
    executor = make_executor(ray_address, opts)
    pair = pair_or_spec(opts, executor)
    max_new_tokens = pair_max_new_tokens(pair, max_new_tokens)
    common = dict(samples=samples, store=store, temperature=temperature, top_p=top_p, seed=seed,
                  max_new_tokens=max_new_tokens, batch_size=batch_size, executor=executor)
    bars = StageBars()
    try:
        if "router" in chosen and executor is not None:
            pair = pair_from_options(opts)  # the router reads the base's hidden states here (training, its cut)
        if "router" in chosen and router_path is None:
            from core.evaluation.sweep import calibration_rollouts
            from core.instruments.router_training import train_router

            rollouts = calibration_rollouts(pair, calibration_set, progress=None, **common)
            router_path = str(Path(out) / "router")
            made = train_router(pair, list(rollouts), "gate", out=router_path, seed=seed)
            click.echo(f"router trained on {len(rollouts)} calibration rollouts (held-out AUROC "
                       f"{made.card['held_out_auroc'] or float('nan'):.3f}) -> {router_path}", err=True)
        table = compare_gates(pair, problems, calibration_set, rho_list, gates=chosen, router=router_path,
                              progress=bars, **common)
    finally:
        bars.close()
        close_executor(executor)
    info = {"pair": pair.spec() if hasattr(pair, "spec") else str(pair), "gate_rhos": rho_list, "gates": chosen,
            "router": router_path, "problems": problems_path or "demo test set", "limit": limit,
            "calibration": calibration or "held out", **{k: v for k, v in common.items()
                                                              if k not in ("store", "executor")},
            "store": str(store.path)}
    paths = write_gates(out, table, info)
    summary = gate_summary(table)
    click.echo(to_markdown(summary, index="label", columns=["rho", "accuracy", "pass@k", "recovery@k",
                                                            "wrong_to_right", "right_to_wrong",
                                                            "reason_evals_per_token", "reason_forwards_per_token",
                                                            "wall_s_per_token"]))
    where = "averaged over benchmarks" if summary["benchmark"].iloc[0] == "average" else summary["benchmark"].iloc[0]
    click.echo(f"({where}; recovery against: {table['reference'].iloc[0]}) -> {paths['csv']}, {paths['html']}")


def _free_gates_outputs(out: Path, overwrite: bool, *, router: bool) -> None:
    """Refuse (naming --overwrite) a gates.csv, gates.html or (`router`: one is trained here) router/ in `out` that
    is not a shoot-out's own: a rerun into the folder `forkpoint gates` wrote resumes and rewrites them."""
    from core.decoding.router import read_card  # deferred: torch, pandas (like the command's own)
    from core.reports.gates import read_gates

    def readable(read: Any, path: Path) -> bool:
        try:
            read(path)
        except InvalidInputError:
            return False
        return True

    table = out / "gates.csv"
    own_table = table.is_file() and readable(read_gates, table)
    free_output(table, overwrite, own=lambda _path: own_table, command="gates")
    free_output(out / "gates.html", overwrite, own=lambda _path: own_table, command="gates")  # written with gates.csv
    if router:  # trained before the shoot-out: an interrupted run leaves it without gates.csv
        free_output(out / "router", overwrite, own=lambda path: path.is_dir() and readable(read_card, path),
                    command="gates")
