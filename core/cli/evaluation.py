"""forkpoint analyze | eval | reproduce | demo measure: the paper's analyses, the evaluation harness, and
the one-command reproduction of the paper's table and figures."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import click

from core import settings
from core.cli.common import (
    echo,
    check_output,
    close_executor,
    calibration_option,
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
    preset_setting_option,
    problems_and_calibration,
    ray_option,
    router_folder_option,
    setting_option,
    StageBars,
    store_option,
)
from core.errors import InvalidInputError

RATIOS_HELP = "Comma-separated calibration ratios r (the gate's τ is the 1-r quantile), each in (0, 1), e.g. 0.01,0.02."
BASELINE_RHO_HELP = ("Takeover rate of the random / early-only baselines: 'realised' (the rate Guided realised, per "
                     "ratio) or a number in (0, 1]; repeat for several. Default: realised and 0.25 (the paper's).")
SKIP_FIRST_HELP = ("The gates never fire at the first k response positions (for a pair whose formats differ at t = 0, "
                   "e.g. a raw base beside a chat model without a thinking mode). Default 0, the paper's gate.")
BUDGETS_HELP = ("Comma-separated takeover caps for Guided (share of max-new-tokens); 'none' = no cap, the "
                "paper's gate. E.g. none,0.1.")


@main.command()
@store_option
@click.option("--out", required=True, type=click.Path(),
              help="Output folder (report.html and one CSV per table), or a .html file (the report alone).")
@setting_option("score", dest="score_name")
@overwrite_option("the report in --out")
@click.option("--only", "only", multiple=True, metavar="ANALYSIS",
              help="Run only these analyses (repeatable; names: `core.list_analyses()`, e.g. lorenz, position).")
@setting_option("report_keep_gib", dest="keep_gib")
@fail_cleanly
def analyze(store_path: str | None, out: str, score_name: str, overwrite: bool, only: tuple[str, ...],
            keep_gib: float) -> None:
    """Write a self-contained HTML report with every registered analysis, and the tables as CSV.

    --out FOLDER: FOLDER/report.html and FOLDER/<table>.csv; --out NAME.html: that report file alone.
    A failed run (a full disk, ...) leaves nothing behind: no empty folder, no part of the files."""
    from core.analysis.registry import analysis
    from core.reports.report import report_html

    names = [analysis(name).name for name in only] or None  # an unknown name is a message listing the choices

    as_file = Path(out).suffix.lower() in (".html", ".htm")  # the report file itself, not a folder named so
    check_output(out, "--out", folder=not as_file)
    html = free_output(Path(out) if as_file else Path(out) / "report.html", overwrite)
    from core.io.stored_traces import StoredTraces

    store = open_store(store_path)
    listed, unreadable = store.listing()  # a damaged file is reported and skipped, never fatal
    from core.cli.store import warn_unreadable

    warn_unreadable(unreadable)
    readable = set(listed["key"])
    # keys in the store's order; each analysis reads the traces in a pass of its own (those that fit --report-keep-gib once)
    ordered = store.keys()  # a listing of files, not a dict
    traces = StoredTraces(store, [k for k in ordered if k in readable])
    if not traces:
        raise click.ClickException(f"The store {store.path} has no traces; generate some first")
    from core.io.atomic import make_folders, remove_empty, write_folder

    if as_file:  # a failed write leaves no folder it made and no part of the file
        created = make_folders(html.parent)
        try:
            report_html(traces, str(html), score=score_name, overwrite=True, only=names, keep_gib=keep_gib)
        except BaseException:
            remove_empty(created)
            raise
        echo(f"report -> {html}")
        return
    write_folder(out, lambda tmp: report_html(traces, str(tmp / "report.html"), score=score_name, overwrite=True,
                                              outdir=str(tmp), only=names, keep_gib=keep_gib), what="analysis report")
    echo(f"report -> {html} (tables as CSV in {out})")


def _baseline_rhos(given: tuple[str, ...]) -> list[str | float]:
    """--baseline-rho values (default: realised and the paper's 0.25), checked by core."""
    from core.evaluation.sweep import DEFAULT_BASELINE_RHOS, check_baseline_rhos

    try:
        return check_baseline_rhos(given or DEFAULT_BASELINE_RHOS)
    except InvalidInputError as err:  # named as the flag
        raise click.BadParameter(str(err).replace("baseline_rho", "--baseline-rho")) from err


def _budgets(text: str) -> list[float | None]:
    """--budgets: caps in [0, 1] or none/off; at least one."""
    out: list[float | None] = []
    for x in text.split(","):
        x = x.strip().lower()
        if not x:
            continue
        if x in ("none", "off"):
            out.append(None)
            continue
        try:
            value = float(x)
        except ValueError:
            value = float("nan")
        if not 0.0 <= value <= 1.0:
            raise click.BadParameter(f"takes numbers in [0, 1] or 'none', got {x!r}", param_hint="--budgets")
        out.append(value)
    return out or [None]


def _shard(text: str | None) -> tuple[int, int] | None:
    """--shard i/n with 0 ≤ i < n."""
    if text is None:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise click.BadParameter(f"must look like 0/4 (i/n), got {text!r}", param_hint="--shard") from None
    if not 0 <= i < n:
        raise click.BadParameter(f"i/n needs 0 ≤ i < n, got {text!r}", param_hint="--shard")
    return i, n


@main.command(name="eval")
@pair_options
@store_option
@click.option("--problems", "problems_path", help="Problem source: JSONL/CSV file, hf:<dataset id>[:config][:split], "
              "or gsm8k / math500 / aime24 / aime25 / amc23 / olympiadbench (default: the demo test set).")
@calibration_option("the demo calibration set with the demo test set, else the first --calibration-problems of "
                    "--problems (at most a quarter), which are then not evaluated", in_sample=True)
@setting_option("calibration_problems")
@click.option("--limit", type=click.IntRange(1), help="Use the first N problems.")
@click.option("--ratios", default=str(settings.RATIO), show_default=True, help=RATIOS_HELP)
@click.option("--budgets", default="none", show_default=True, help=BUDGETS_HELP)
@setting_option("window")
@setting_option("samples")
@setting_option("temperature")
@setting_option("top_p")
@setting_option("max_new_tokens")
@click.option("--baseline-rho", "baseline_rho", multiple=True, help=BASELINE_RHO_HELP)
@click.option("--no-entropy-gated", is_flag=True, help="Skip the entropy-gated variant (the paper's cheap gate).")
@click.option("--skip-first", default=0, show_default=True, type=click.IntRange(0), help=SKIP_FIRST_HELP)
@click.option("--shard", help="i/n: run only the i-th of n deterministic shards (rerun without it to summarise).")
@click.option("--out", type=click.Path(dir_okay=False),
              help="Write the table as CSV, plus .md and a recovery plot .html beside it. A rerun into files "
                   "`forkpoint eval` wrote rewrites them (the run resumes from the store); any other existing file "
                   "is refused without --overwrite.")
@overwrite_option("--out (and its .md, .html)", " and `forkpoint eval` did not write it (a rerun rewrites eval's own "
                  "output without --overwrite)")
@ray_option
@fail_cleanly
def eval_(store_path: str | None, problems_path: str | None, calibration: str | None, calibration_problems: int,
          limit: int | None, ratios: str, budgets: str, window: int, samples: int, temperature: float, top_p: float,
          max_new_tokens: int, baseline_rho: tuple[str, ...], no_entropy_gated: bool, skip_first: int,
          shard: str | None, out: str | None, overwrite: bool, ray_address: str | None, **opts: Any) -> None:
    """Accuracy (and the shares wrong and ungraded), pass@k, realised rate and recovery: base, reasoner, Guided
    and the entropy-gated variant at each ratio r (and cap), and the random / early baselines at Guided's
    realised rate and at 0.25. Every trace is stored; reruns resume."""
    from core.evaluation.harness import shard_of, to_markdown
    from core.evaluation.sweep import budget_sweep

    ratio_list, budget_list, shard_at = float_list(ratios, "ratio", "--ratios"), _budgets(budgets), _shard(shard)
    if out:
        check_output(out, "--out", parents=False)  # found missing only after hours of work would lose the table
        _free_eval_outputs(Path(out), overwrite)
    check_output(open_store(store_path).path, "--store", folder=True)
    executor = make_executor(ray_address, opts)
    pair = pair_or_spec(opts, executor)
    max_new_tokens = pair_max_new_tokens(pair, max_new_tokens)
    problems, calibration_set = problems_and_calibration(problems_path, calibration, limit, calibration_problems,
                                                         verb="evaluating")
    if shard_at:
        problems = shard_of(problems, shard_at)
    bars = StageBars()
    try:
        table = budget_sweep(pair, problems, calibration_set, ratio_list, budgets=budget_list,
                             window=window, samples=samples, store=open_store(store_path), temperature=temperature,
                             top_p=top_p, max_new_tokens=max_new_tokens, progress=bars, executor=executor,
                             baseline_rhos=_baseline_rhos(baseline_rho), entropy_gated=not no_entropy_gated,
                             skip_first=skip_first)
    finally:
        bars.close()
        close_executor(executor)
    raw = table
    table = table.assign(policy=[p if p == c else f"{p} ({c})" for p, c in zip(table["policy"], table["config"])])
    markdown = to_markdown(table, columns=["accuracy", "ungraded", "pass@k", "rho", "mean_tokens", "recovery",
                                           "recovery@k"])
    echo(markdown)
    echo(f"recovery against: {table['reference'].iloc[0]}")
    if out:
        _write_eval_outputs(raw, table, markdown, Path(out))


EVAL_SIDE_SUFFIXES = (".md", ".html")  # written beside eval's CSV: the table as Markdown, the recovery plot


def _free_eval_outputs(out: Path, overwrite: bool) -> None:
    """Refuse (naming --overwrite) an existing --out, .md or .html that is not eval's own output; a rerun into
    eval's own CSV (and the files beside it) resumes and rewrites them."""
    if out.suffix.lower() in EVAL_SIDE_SUFFIXES:
        raise click.BadParameter(f"{out} would be replaced by the {out.suffix} written beside the CSV; give the CSV's "
                                 "name, e.g. eval.csv", param_hint="--out")
    own = _is_eval_table(out)
    for path in (out, *(out.with_suffix(s) for s in EVAL_SIDE_SUFFIXES)):
        free_output(path, overwrite, own=lambda _path: own, command="eval")


def _is_eval_table(path: Path) -> bool:
    """Whether `path` is a CSV that `forkpoint eval` wrote: its header holds every column of the policy table."""
    from core.evaluation.harness import POLICY_TABLE_COLUMNS  # deferred: pandas, torch

    try:
        with path.open(newline="", encoding="utf-8") as fh:
            header = next(csv.reader([fh.readline(1 << 16)]), [])  # the first line only, however large the file
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return set(POLICY_TABLE_COLUMNS) <= set(header)


def _write_eval_outputs(raw, table, markdown: str, out: Path) -> None:
    """The eval table as CSV and Markdown, and recovery against ρ as a plot: one line per policy and
    cap, its points the ratios r (`raw`: the sweep's rows before their labels name the configuration)."""
    import pandas as pd

    from core.reports.report import recovery_figure
    from core.io.atomic import write_atomic
    from core.io.csvsafe import write_csv

    write_csv(table, out, what="eval table")
    write_atomic(out.with_suffix(".md"), lambda fh: fh.write(markdown + "\n"), what="eval table")
    points = raw.dropna(subset=["ratio"])
    curve = points.assign(policy=[p if pd.isna(b) else f"{p} (cap={b:g})"
                                  for p, b in zip(points["policy"], points["budget"])])
    page = recovery_figure(curve, reference=str(table["reference"].iloc[0])).to_html(include_plotlyjs=True)
    write_atomic(out.with_suffix(".html"), lambda fh: fh.write(page), what="recovery plot")


@main.command()
@pair_options
@store_option
@click.option("--thinking", help="Same-size thinking model (hub id, directory or .gguf): the recovery reference.")
@click.option("--thinking-revision", help="Pin the thinking model to a hub revision.")
@click.option("--thinking-format", help="Thinking model's prompt format (default: chat:think; paper preset: "
              "paper-think).")
@click.option("--problems", "problems", multiple=True, required=True,
              help="Benchmark: [NAME=]SOURCE, SOURCE a JSONL/CSV file, hf:<dataset id>[:config][:split], or gsm8k / "
                   "math500 / aime24 / aime25 / amc23 / olympiadbench. Repeat for several benchmarks.")
@calibration_option("--calibration-problems held out from --problems (spread over the benchmarks, at most a "
                    "quarter of each)", multiple=True)
@setting_option("calibration_problems")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory (report.html, CSVs; "
              "the store defaults to OUT/store).")
@click.option("--preset", type=click.Choice(list(settings.PRESETS)), help="Named settings, e.g. paper: T 0.6, top-p "
              "0.95, 8 samples, 16384 new tokens, the paper's prompts. Explicit flags override it.")
@click.option("--ratios", default=",".join(map(str, settings.RATIOS)), show_default=True, help=RATIOS_HELP)
@click.option("--budgets", default="none", show_default=True, help=BUDGETS_HELP)
@setting_option("window")
@setting_option("score", dest="score_name")
@click.option("--reference", help="Recovery reference: a policy label (thinking, reason) or Pass@k numbers, "
              "e.g. 0.641 or gsm8k=0.9,math500=0.7 (default: thinking when --thinking is given, else reason).")
@click.option("--no-baselines", is_flag=True, help="Skip the random / early baselines.")
@click.option("--baseline-rho", "baseline_rho", multiple=True, help=BASELINE_RHO_HELP)
@click.option("--no-entropy-gated", is_flag=True, help="Skip the entropy-gated variant (the paper's cheap gate).")
@click.option("--skip-first", default=0, show_default=True, type=click.IntRange(0), help=SKIP_FIRST_HELP)
@click.option("--limit", type=click.IntRange(1), help="Use the first N problems of each benchmark.")
@gate_rhos_option(None, "Also run the gate shoot-out (forkpoint gates) at these comma-separated target takeover "
                  "rates ρ, each in (0, 1), as a section of the report (e.g. 0.02,0.05).")
@router_folder_option("With --gate-rhos: a trained router's folder, so the learned gate joins the shoot-out.")
@preset_setting_option("samples")
@preset_setting_option("temperature")
@preset_setting_option("top_p")
@preset_setting_option("max_new_tokens")
@setting_option("seed")
@setting_option("batch_size")
@ray_option
@fail_cleanly
def reproduce(store_path: str | None, thinking: str | None, thinking_revision: str | None,
              thinking_format: str | None, problems: tuple[str, ...],
              calibration: tuple[str, ...], calibration_problems: int, out: str, preset: str | None, ratios: str,
              budgets: str, window: int, score_name: str, reference: str | None, no_baselines: bool,
              baseline_rho: tuple[str, ...], no_entropy_gated: bool, skip_first: int,
              limit: int | None, gate_rhos: str | None, router_path: str | None, samples: int | None,
              temperature: float | None, top_p: float | None,
              max_new_tokens: int | None, seed: int, batch_size: int, ray_address: str | None, **opts: Any) -> None:
    """The paper's table and figures in one run: calibrate, sweep r, Guided, the entropy-gated variant and
    the random / early baselines (at Guided's realised ρ and at 0.25), base, guide and thinking reference,
    every analysis per benchmark; one report.html plus CSVs. Rerun to resume."""
    from core.reports.reproduce import reproduce as run

    ratio_list, budget_list, ref = float_list(ratios, "ratio", "--ratios"), _budgets(budgets), _reference(reference)
    check_output(out, "--out", folder=True)
    if store_path:
        check_output(store_path, "--store", folder=True)
    if bool(opts.get("base")) != bool(opts.get("reason")):
        raise click.UsageError("Give both --base and --reason (or neither, for the demo pair).")
    base = opts.get("base") or pair_from_options(opts)  # neither --base nor --reason: the demo pair
    bars = StageBars()
    executor = make_executor(ray_address, opts)
    try:
        result = run(base, opts.get("reason"), list(problems), out, thinking=thinking, preset=preset,
                     store=open_store(store_path) if store_path else None, ratios=ratio_list,
                     budgets=budget_list, window=window, score=score_name,
                     calibration=list(calibration) or None, calibration_problems=calibration_problems,
                     reference=ref, baselines=not no_baselines,
                     baseline_rhos=_baseline_rhos(baseline_rho), entropy_gated=not no_entropy_gated,
                     skip_first=skip_first, limit=limit, samples=samples,
                     temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed,
                     batch_size=batch_size, base_format=opts.get("base_format"),
                     reason_format=opts.get("reason_format"), thinking_format=thinking_format,
                     device=opts["device"], dtype=opts["dtype"],
                     revisions={"base": opts.get("base_revision"), "reason": opts.get("reason_revision"),
                                "thinking": thinking_revision},
                     trust_remote_code=opts.get("trust_remote_code", False), progress=bars, executor=executor,
                     gate_rhos=float_list(gate_rhos, "ratio", "--gate-rhos") if gate_rhos else (),
                     router=router_path)
    finally:
        bars.close()
        close_executor(executor)
    shown = result.table[result.table["benchmark"] == result.table["benchmark"].iloc[-1]]
    from core.evaluation.harness import to_markdown

    bench = str(shown["benchmark"].iloc[0])
    echo(f"{'Average over the benchmarks' if bench == 'average' else 'Benchmark ' + bench} "
               f"(per benchmark: {Path(out) / 'table.csv'}):")
    echo(to_markdown(shown, index="setting", columns=["accuracy", "ungraded", "pass@k", "recovery",
                                                            "recovery@k", "rho"]))
    echo(f"recovery against: {result.info['reference']}")
    from core.reports.paper import headline

    findings = headline(result.analyses).rename(columns={"benchmark": "on"})  # one row per finding, not pivoted
    echo(to_markdown(findings, index="finding", columns=["on", "this run", "paper"]))
    echo(f"report -> {result.report}", err=False)
    echo(f"CSVs -> {result.out}", err=True)


def _reference(text: str | None) -> Any:
    """--reference: None, a policy label, a number, or NAME=NUMBER pairs."""
    if text is None:
        return None
    try:
        if "=" not in text:
            return float(text)
        return {name.strip(): float(value) for name, _, value in (p.partition("=") for p in text.split(","))}
    except ValueError:
        if "=" in text:
            raise click.BadParameter(f"--reference NAME=NUMBER pairs need numbers, got {text!r}") from None
        return text


@click.command(name="measure")
@click.option("--demo-dir", type=click.Path(file_okay=False), help="Demo pair directory (default: the bundled pair).")
@click.option("--out", type=click.Path(file_okay=False),
              help="Where CARD.md and measure.json go (default: the demo pair's folder in a checkout; the working "
                   "directory when the pair is the installed package's, which is never written).")
@setting_option("demo_measure_problems", dest="n", flag="--limit", aliases=["--n"])  # --n: its old spelling
@setting_option("demo_measure_samples", dest="samples", flag="--samples")
@fail_cleanly
def demo_measure(demo_dir: str | None, out: str | None, n: int, samples: int) -> None:
    """Measure the demo pair's properties and write its CARD.md and measure.json (says where)."""
    from core.reports.demo_card import write_card
    from core.demo.pair import DEMO_DIR
    from core.packaged import is_installed

    source = Path(demo_dir or DEMO_DIR)
    target = Path(out) if out is not None else (Path.cwd() if is_installed(source) else source)
    if is_installed(target):
        raise click.BadParameter(f"{target} is inside the installed forkpoint package; give another folder",
                                 param_hint="--out")
    check_output(target, "--out", folder=True)
    write_card(source, n=n, samples=samples, out=target)
    echo(f"measured {source} on {n} problems: {target / 'CARD.md'} and {target / 'measure.json'}")


def _register_demo_measure() -> None:
    from core.cli.app import demo

    demo.add_command(demo_measure)


_register_demo_measure()
