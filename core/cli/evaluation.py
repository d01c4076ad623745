"""forkpoint analyze | eval: the paper's analyses and the evaluation harness."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from core.cli.common import _Bar, _fail_cleanly, _pair, _problems, _store, main, pair_options, store_option
from core.metrics import DEFAULT_SCORE, SCORES


@main.command()
@store_option
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--score", "score_name", type=click.Choice(SCORES), default=DEFAULT_SCORE, show_default=True)
@_fail_cleanly
def analyze(store_path: str | None, out: str, score_name: str) -> None:
    """Write a self-contained HTML report with every analysis, and the tables as CSV."""
    from core.analysis.report import report_html, report_tables

    store = _store(store_path)
    traces = [store.get(k) for k in store.keys()]
    if not traces:
        raise click.ClickException(f"The store {store.path} has no traces; generate some first")
    Path(out).mkdir(parents=True, exist_ok=True)
    report_html(traces, str(Path(out) / "report.html"), score=score_name)
    report_tables(traces, out, score=score_name)
    click.echo(f"report -> {Path(out) / 'report.html'}")


@main.command(name="eval")
@pair_options
@store_option
@click.option("--problems", "problems_path", type=click.Path(exists=True, dir_okay=False),
              help="JSONL/CSV problem set (default: the demo test set).")
@click.option("--calibration", "calibration_path", type=click.Path(exists=True, dir_okay=False),
              help="Problems whose base rollouts calibrate the gate (default: demo calibration set, "
                   "or the first quarter of --problems).")
@click.option("--limit", type=int, help="Use the first N problems.")
@click.option("--budgets", default="0.05", show_default=True,
              help="Comma-separated calibration ratios r, e.g. 0.01,0.02,0.05,0.1,0.2.")
@click.option("--window", default=16, show_default=True)
@click.option("--samples", default=1, show_default=True, help="Samples per problem (pass@k uses all).")
@click.option("--temperature", default=0.0, show_default=True)
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--max-new-tokens", default=256, show_default=True)
@click.option("--shard", help="i/n: run only the i-th of n deterministic shards (rerun without it to summarise).")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the table as CSV, plus .md and a recovery plot .html.")
@_fail_cleanly
def eval_(store_path: str | None, problems_path: str | None, calibration_path: str | None, limit: int | None,
          budgets: str, window: int, samples: int, temperature: float, top_p: float, max_new_tokens: int,
          shard: str | None, out: str | None, **opts: Any) -> None:
    """Accuracy, pass@k, realised rate and recovery: base, reasoner, Guided at each budget, and the
    random / early baselines at Guided's realised rate. Every trace is stored; reruns resume."""
    from core.evaluation.harness import budget_sweep, shard_of, to_markdown

    pair = _pair(opts)
    problems = _problems(problems_path, limit)
    if calibration_path:
        calibration = _problems(calibration_path, None)
    elif problems_path is None:
        from core.demo.pair import demo_problems

        calibration = demo_problems("calib")
    else:
        calibration, problems = problems[: max(1, len(problems) // 4)], problems[max(1, len(problems) // 4):]
    if shard:
        try:
            i, n = (int(x) for x in shard.split("/"))
        except ValueError as err:
            raise click.BadParameter(f"--shard must look like 0/4, got {shard!r}") from err
        problems = shard_of(problems, (i, n))
    ratios = [float(b) for b in budgets.split(",") if b.strip()]
    bar = _Bar("eval")
    table = budget_sweep(pair, problems, calibration, ratios, window=window, samples=samples,
                         store=_store(store_path), temperature=temperature, top_p=top_p,
                         max_new_tokens=max_new_tokens, progress=bar)
    bar.close()
    table = table.assign(policy=[p if r != r else f"{p} (r={r:g})" for p, r in zip(table["policy"], table["ratio"])])
    markdown = to_markdown(table, columns=["accuracy", "pass@k", "rho", "mean_tokens", "recovery", "recovery@k"])
    click.echo(markdown)
    if out:
        from core.analysis.report import recovery_figure

        table.to_csv(out, index=False)
        Path(out).with_suffix(".md").write_text(markdown + "\n", encoding="utf-8")
        curve = table.dropna(subset=["ratio"]).assign(policy=lambda f: f["policy"].str.replace(r" \(r=.*\)", "", regex=True))
        recovery_figure(curve).write_html(Path(out).with_suffix(".html"), include_plotlyjs=True)


