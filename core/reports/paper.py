"""The reproduction report, laid out like the seed paper: its main table (accuracy / Pass@k / recovery / ρ
per benchmark and on average) and its figures (recovery vs ρ, Lorenz & Gini, position density, entropy
IoU, planning enrichment, failure AUROC, reasoner rank in the base top-k), in one self-contained HTML file.

Every piece of model or user text is escaped; plotly's JavaScript is embedded once (works offline).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from core.reports import report as R
from core.reports.gates_report import gates_section
from core.evaluation.harness import add_recovery, reference_values
from core.io.atomic import write_atomic

AVERAGE = "average"
# The paper's main table (Qwen3-0.6B-Base guided by Qwen3-8B; average over its benchmarks), as in docs/REPRODUCE.md.
# Its 91% recovery is as quoted; from the quoted averages (61.4 − 36.0) / (64.1 − 36.0) = 90.4%.
PAPER_NUMBERS = pd.DataFrame([
    {"setting": "base alone", "accuracy": 0.130, "pass@k": 0.360, "recovery@k": math.nan, "rho": 0.0},
    {"setting": "guided, ρ ≈ 0.04", "accuracy": 0.291, "pass@k": 0.614, "recovery@k": 0.91, "rho": 0.04},
    {"setting": "guided, ρ ≈ 0.13", "accuracy": 0.524, "pass@k": 0.800, "recovery@k": 1.57, "rho": 0.13},
    {"setting": "Qwen3-0.6B thinking (reference)", "accuracy": 0.434, "pass@k": 0.641, "recovery@k": 1.0, "rho": math.nan},
    {"setting": "Qwen3-8B thinking (guide)", "accuracy": 0.781, "pass@k": 0.873, "recovery@k": math.nan, "rho": 1.0},
    {"setting": "random positions, ρ = 0.25", "accuracy": 0.264, "pass@k": 0.552, "recovery@k": math.nan, "rho": 0.25},
    {"setting": "early-only prefix, ρ = 0.25", "accuracy": 0.257, "pass@k": 0.584, "recovery@k": math.nan, "rho": 0.25},
])
END_LABELS = {"base": "base alone", "reason": "guide (reasoner alone)", "thinking": "same-size thinking model"}
# The paper's numbers that it gives for one benchmark (finding -> {benchmark short name: value}).
PAPER_PER_BENCHMARK: dict[str, dict[str, float]] = {
    "failure AUROC, top-100 mean score": {"gsm8k": 0.851},
    "failure AUROC, top-100 mean base entropy": {"gsm8k": 0.817},
}
PLANNING_NOTE = ("every non-execute tag pooled ({tags}): the paper's planning / execution split, which its 7.5× "
                 "(top disagreement) and 17.6× (taken over) compare with")
POOLED_AUROC = ("– (pooled over benchmarks whose base rates differ, which moves an AUROC: compare the rows per "
                "benchmark; the paper's {value} is GSM8K alone)")
RANK_PAPER = ("always, i.e. a share of 1.0 (ReasonMaxxer: the token RL promotes always lies in the base's top 5; "
              "here the share of spikes whose reasoner top token is in the base top 5)")


def planning_note(enrichment: pd.DataFrame | None) -> str:
    """PLANNING_NOTE naming the non-execute tags this run tagged (not a fixed list it may never have used)."""
    tags = [] if enrichment is None or enrichment.empty or "category" not in enrichment else [
        str(c) for c in dict.fromkeys(enrichment["category"]) if c not in ("execute", "planning")]
    return PLANNING_NOTE.format(tags=" + ".join(tags) if tags else "none tagged in this run")
PLAN_ONLY_NOTE = "the 'plan' tag alone (the demo card's definition); the paper has no such number"
METRIC_COLUMNS = ("accuracy", "pass@k", "recovery@k", "rho")


def setting_label(row: Mapping[str, Any]) -> str:
    """A readable row name: "base alone", "guided r=0.05", "entropy-gated r=0.05", "random positions (ρ of
    guided r=0.05)", "random positions, ρ = 0.25"."""
    policy, config = str(row["policy"]), str(row.get("config", row["policy"]))
    if policy in END_LABELS and config == policy:
        return END_LABELS[policy]
    if policy == "guided":
        return f"guided {config}"
    if policy == "entropy_gated":
        return f"entropy-gated {config}"
    if config.startswith("ρ="):
        return f"{policy.replace('_', ' ')}, ρ = {config[2:]}"
    return f"{policy.replace('_', ' ')} (ρ of guided {config})"


def paper_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """Long table: setting, benchmark (each, plus "average"), accuracy, pass@k, rho, recovery@k, recovery.

    The average row averages accuracy, pass@k and ρ over benchmarks and computes recovery from those
    averages (as the paper's table: (61.4 − 36.0) / (64.1 − 36.0) = 90.4%, quoted there as 91%);
    reference = the sweep's reference. "ungraded" (no answer extracted) is averaged like accuracy."""

    df = sweep.assign(setting=[setting_label(r) for _, r in sweep.iterrows()])
    if "ungraded" not in df.columns:
        df = df.assign(ungraded=math.nan)
    keep = ["setting", "policy", "config", "benchmark", "accuracy", "ungraded", "pass@k", "rho", "mean_tokens", "k"]
    long = df[keep].copy()
    if long["benchmark"].nunique() > 1:
        avg = (long.groupby(["setting", "policy", "config"], sort=False)[["accuracy", "ungraded", "pass@k", "rho",
                                                                          "mean_tokens"]]
               .mean().reset_index().assign(benchmark=AVERAGE, k=int(long["k"].min())))
        long = pd.concat([long, avg[keep]], ignore_index=True)
    reference = _reference_of(sweep)
    ends = long[long["policy"] == long["config"]]
    return recovery_notes(add_recovery(long, base="base", reference=reference, ends=ends), reference, ends)


NO_GAP = "the reference does not beat the base here, so recovery is undefined"


def recovery_notes(table: pd.DataFrame, reference: Any, ends: pd.DataFrame) -> pd.DataFrame:
    """`table` with "no_gap" (per benchmark: the metrics, of "accuracy" and "pass@k", on which the reference
    does not beat the base, so recovery there is undefined) and, on the average rows, "no_gap_in" (the
    benchmarks averaged over where that holds): why a recovery cell is "–", or why an average is partial."""
    gaps: dict[str, list[str]] = {}
    for bench in dict.fromkeys(table["benchmark"]):
        base = ends[(ends["benchmark"] == bench) & (ends["policy"] == "base")]
        ref_acc, ref_k, _ = reference_values(ends, bench, reference)
        if base.empty:
            continue
        gaps[bench] = [m for m, ref in (("accuracy", ref_acc), ("pass@k", ref_k))
                       if not math.isnan(ref) and not ref > float(base[m].iloc[0])]
    inside = [b for b in gaps if b != AVERAGE and gaps[b]]
    return table.assign(no_gap=[",".join(gaps.get(b, [])) for b in table["benchmark"]],
                        no_gap_in=[",".join(inside) if b == AVERAGE else "" for b in table["benchmark"]])


def _reference_of(sweep: pd.DataFrame) -> Any:
    """The reference the sweep used: a policy label, else the given numbers (per benchmark)."""
    names = set(sweep.get("reference", pd.Series(dtype=str)).dropna())
    labels = {n.removeprefix("policy ").removesuffix(" (missing)") for n in names if n.startswith("policy ")}
    if labels:
        return labels.pop()
    return sweep.attrs.get("reference_numbers", math.nan)


def paper_table_html(table: pd.DataFrame) -> str:
    """The main table as HTML: one row per setting, per benchmark "acc / ungraded / Pass@k / recovery (on
    accuracy) / recovery@k / ρ" cells ("ungraded": the share of samples with no answer extracted, when the table
    has it; recovery when it has it). A "–" recovery where the reference does not beat the base is marked "†", an
    average over such a benchmark "*", each explained under the table; rows with identical traces say so."""
    benches = list(dict.fromkeys(table["benchmark"]))
    k = int(table["k"].min()) if len(table) else 1
    ungraded = "ungraded" in table.columns
    rec = "recovery" in table.columns
    head = "".join(f"<th colspan={4 + ungraded + rec}>{html.escape(str(b))}</th>" for b in benches)
    sub = "".join("<th>acc</th>" + ("<th>ungraded</th>" if ungraded else "") + f"<th>Pass@{k}</th>"
                  + ("<th>recovery</th>" if rec else "") + f"<th>recovery@{k}</th><th>ρ</th>" for _ in benches)
    rows, marks = [], set()
    for setting in dict.fromkeys(table["setting"]):
        cells = []
        for b in benches:
            part = table[(table["setting"] == setting) & (table["benchmark"] == b)]
            vals = part.iloc[0] if len(part) else None
            recs = [(col, metric) for col, metric in (("recovery", "accuracy"), (f"recovery@k", "pass@k"))
                    if col != "recovery" or rec]
            shown = []
            for col, metric in recs:
                cell = _pct(vals, col)
                if vals is not None and metric in str(vals.get("no_gap", "") or "").split(",") and cell == "–":
                    cell, _ = "–†", marks.add("†")
                elif vals is not None and str(vals.get("no_gap_in", "") or "") and cell != "–":
                    cell, _ = cell + "*", marks.add("*")
                shown.append(cell)
            cells += [_pct(vals, "accuracy")] + ([_pct(vals, "ungraded")] if ungraded else []) + [
                _pct(vals, "pass@k"), *shown, _num(vals, "rho")]
        same = table[table["setting"] == setting].get("same_traces_as", pd.Series(dtype=object)).dropna()
        label = html.escape(str(setting)) + (f" <span class='note'>(the same traces as {html.escape(str(same.iloc[0]))})"
                                             "</span>" if len(same) and str(same.iloc[0]) else "")
        rows.append(f"<tr><td>{label}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    notes = []
    if "†" in marks:
        notes.append("† " + NO_GAP + ".")
    if "*" in marks:
        where = ", ".join(sorted({b for v in table.get("no_gap_in", pd.Series(dtype=str)) for b in str(v).split(",")
                                  if b}))
        notes.append(f"* averaged over benchmarks that include {html.escape(where)}, where the reference does not "
                     "beat the base: recovery from the averages, not an average of recoveries.")
    foot = "".join(f"<p class='note'>{n}</p>" for n in notes)
    return (f"<table><tr><th rowspan=2>setting</th>{head}</tr><tr>{sub}</tr>" + "".join(rows) + "</table>" + foot)


def _pct(row: Any, col: str) -> str:
    v = float("nan") if row is None else float(row[col])
    return "–" if math.isnan(v) else f"{100 * v:.1f}%"


def _num(row: Any, col: str) -> str:
    v = float("nan") if row is None else float(row[col])
    return "–" if math.isnan(v) else f"{v:.3f}"


def headline(analyses: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per headline finding and benchmark: this run's value beside the paper's (analyses from
    `benchmark_tables`, or `report_tables` for one group). Columns finding, benchmark, this run, paper.
    The failure AUROC has a row per benchmark (the paper gives it for GSM8K); the rest are on the pooled
    group ("all", or the only benchmark)."""
    def frame(name: str) -> pd.DataFrame:
        df = analyses.get(name)
        if df is None or df.empty:
            return pd.DataFrame()
        return df if "benchmark" in df.columns else df.assign(benchmark=R.ALL_BENCHMARKS)

    def pick(name: str, col: str, where: Callable[[pd.DataFrame], pd.Series], bench: str | None = None) -> float:
        df = frame(name)
        if df.empty:
            return math.nan
        df = R.main_rows(df).assign(benchmark=main) if bench is None else df[df["benchmark"] == bench]
        rows = df[where(df)]
        return float(rows[col].iloc[0]) if len(rows) else math.nan

    def enr(category: str, where: str) -> float:
        return pick("enrichment", "enrichment", lambda d: (d["set"] == where) & (d["category"] == category))

    main = _main_benchmark(analyses)
    gini = R.main_rows(frame("gini"))
    per_response = float(gini.loc[gini["trace"] != "pooled", "gini"].mean()) if len(gini) else math.nan
    out = [
        ("Gini of the score, mean over responses", main, per_response, "≈ 0.94 (an average over responses)"),
        ("Gini of the score, pooled over all tokens", main, pick("gini", "gini", lambda d: d["trace"] == "pooled"),
         "– (the paper reports the average)"),
        ("share of tokens holding 80% of the score mass (pooled)", main,
         pick("mass_fraction", "fraction", lambda d: d["trace"] == "pooled"),
         "~8% of tokens carry the salient disagreement (threshold not given)"),
        ("position density peak of the top-1% tokens (bin centre u = t/T)", main,
         pick("position_summary", "peak_u", lambda d: d["n"] >= 0), "near 0.05"),
        ("median position u = t/T of the top-1% tokens", main,
         pick("position_summary", "median_u", lambda d: d["n"] >= 0), "– (early; the paper gives the peak)"),
        ("IoU of top-10% score and top-10% base-entropy tokens", main,
         pick("entropy_iou", "iou", lambda d: d["p"] == 0.1), "high for all p"),
    ]
    names = _benchmarks(frame("failure_auroc"))
    several = len([b for b in names if b != R.ALL_BENCHMARKS]) > 1
    for finding, entropy in (("failure AUROC, top-100 mean score", False),
                             ("failure AUROC, top-100 mean base entropy", True)):
        for bench in [b for b in names if b != R.ALL_BENCHMARKS] + [b for b in names if b == R.ALL_BENCHMARKS] \
                or [main]:
            value = pick("failure_auroc", "auroc", (lambda d: d["signal"] == "entropy_base") if entropy
                         else (lambda d: d["signal"] != "entropy_base"), bench=bench)
            paper = (POOLED_AUROC.format(value=_paper_value(finding, "gsm8k")) if several and bench == R.ALL_BENCHMARKS
                     else _paper_value(finding, bench))
            out.append((finding, bench, value, paper))
    note = planning_note(analyses.get("enrichment"))
    out += [
        ("reasoner's top token within the base top-5 (spikes)", main,
         pick("reason_rank_within", "share", lambda d: (d["at"] == "spikes") & (d["k"] == 5)), RANK_PAPER),
        ("planning enrichment among top-1% score tokens [" + note + "]", main, enr("planning", "top_score"),
         "≈ 7.5×"),
        ("planning enrichment among tokens taken over [pooled planning, as above]", main,
         enr("planning", "taken_over"), "≈ 17.6×"),
        ("plan-only enrichment among top-1% score tokens [" + PLAN_ONLY_NOTE + "]", main, enr("plan", "top_score"),
         "–"),
        ("plan-only enrichment among tokens taken over [plan tag alone]", main, enr("plan", "taken_over"), "–"),
    ]
    return pd.DataFrame(out, columns=["finding", "benchmark", "this run", "paper"])


def _benchmarks(df: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(df["benchmark"])) if "benchmark" in df.columns else []


def _main_benchmark(analyses: Mapping[str, pd.DataFrame]) -> str:
    """The benchmark the pooled headline rows are on: "all" with several, else the only one."""
    for df in analyses.values():
        names = _benchmarks(df)
        if names:
            return R.ALL_BENCHMARKS if R.ALL_BENCHMARKS in names else names[0]
    return R.ALL_BENCHMARKS


def _paper_value(finding: str, bench: str) -> str:
    """The paper's number for a finding on one benchmark (matched by short name), or where it gives it."""
    given = PAPER_PER_BENCHMARK.get(finding, {})
    key = str(bench).lower().replace("-", "").replace("_", "")
    if key in given:
        return f"{given[key]:.3f}"
    return "; ".join(f"{v:.3f} ({b.upper()})" for b, v in given.items()) + " — not given for this benchmark"


def recovery_vs_rho_figure(table: pd.DataFrame, reference_name: str) -> go.Figure:
    """Recovery@k against realised ρ on the average (or only) benchmark, one line per policy family."""
    bench = AVERAGE if AVERAGE in set(table["benchmark"]) else table["benchmark"].iloc[0]
    part = table[(table["benchmark"] == bench) & (table["config"] != table["policy"])]
    series = [f"{p} (fixed ρ)" if str(c).startswith("ρ=") else str(p) for p, c in zip(part["policy"], part["config"])]
    part = part.assign(series=series)
    fig = go.Figure()
    for policy in dict.fromkeys(part["series"]):
        rows = part[part["series"] == policy].sort_values("rho")
        fig.add_trace(go.Scatter(x=rows["rho"], y=rows["recovery@k"], mode="lines+markers", name=str(policy),
                                 text=rows["config"], hovertemplate="%{text}: ρ=%{x:.3f}, recovery=%{y:.2f}"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey", annotation_text=reference_name)
    fig.add_hline(y=0.0, line_dash="dot", line_color="lightgrey")
    fig.update_layout(title=f"Recovery@k vs realised takeover rate ({bench})", xaxis_title="realised ρ",
                      yaxis_title="recovery@k", template="plotly_white", height=420)
    return fig


def reproduce_html(path: str, table: pd.DataFrame, analyses: Mapping[str, pd.DataFrame],
                   info: Mapping[str, Any]) -> str:
    """Write the self-contained reproduction report to `path` (replacing it); returns the path."""
    reference = str(info.get("reference", "?"))
    figures: list[tuple[str, go.Figure]] = [("Recovery vs takeover rate", recovery_vs_rho_figure(table, reference))]
    main = {name: R.main_rows(df) for name, df in analyses.items()}
    density = main["position_density"]
    summary = main.get("position_summary", pd.DataFrame())
    if len(summary):
        density.attrs.update(median_u=float(summary["median_u"].iloc[0]), n=int(summary["n"].iloc[0]))
    figures += [("Sparsity: Lorenz curve (base rollouts)", R.lorenz_figure(main["lorenz"])),
                ("Position of the top-1% tokens", R.position_density_figure(density)),
                ("Disagreement vs base uncertainty", R.entropy_iou_figure(main["entropy_iou"]))]
    if "enrichment" in analyses:
        figures.append(("Planning tokens", R.enrichment_figure(main["enrichment"])))
    figures += [("Failure prediction", R.roc_figure(main["roc"], main["failure_auroc"])),
                ("Reasoner's top token in the base top-k", R.reason_rank_figure(main["reason_rank_all"]))]
    parts = [f"<h2>Main table (recovery against: {html.escape(reference)})</h2>", paper_table_html(table),
             "<h3>The paper's numbers (Qwen3-0.6B-Base + Qwen3-8B, average over its benchmarks)</h3>",
             paper_table_html(PAPER_NUMBERS.assign(benchmark="paper average", k=8)),
             "<p class='note'>The paper's table gives averages only (its 91% recovery is as quoted; the quoted "
             "averages give (61.4 − 36.0) / (64.1 − 36.0) = 90.4%); of the analyses it gives one benchmark's "
             "number, the failure AUROC on GSM8K, shown beside that benchmark below.</p>",
             "<h2>Headline analyses against the paper</h2>", R._table_html(headline(analyses))]
    for i, (heading, fig) in enumerate(figures):
        parts.append(f"<h2>{html.escape(heading)}</h2>\n" + fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    if "gates" in analyses:  # the gate shoot-out (core.compare_gates), plotly's JavaScript is embedded above
        parts.append("<h2>Which gate knows when? The gates at equal ρ</h2>\n"
                     + gates_section(analyses["gates"], include_plotlyjs=False))
    for name in ("position_summary", "gini", "mass_fraction", "entropy_iou", "failure_auroc", "reason_rank_within",
                 "enrichment"):
        if name in analyses:
            parts.append(f"<h3>{html.escape(name)}</h3>\n{R._table_html(analyses[name])}")
    settings_json = html.escape(json.dumps(dict(info), indent=1, default=_jsonable))
    header = ("<h1>forkpoint reproduction</h1>"
              f"<p>Recovery = (P − P_base) / (P_ref − P_base) on Pass@k; reference: <b>{html.escape(reference)}</b>. "
              "Analyses are over the base model's own rollouts scored by the reasoner.</p>"
              f"<details><summary>run settings</summary><pre>{settings_json}</pre></details>")
    style = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;font-size:13px}td,th{padding:2px 8px;border-bottom:1px solid #ddd}"
             ".note{color:#666;font-size:12px}")
    doc = ("<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>forkpoint reproduction</title>"
           f"<style>{style}</style></head><body>\n{header}\n" + "\n".join(parts) + "\n</body></html>\n")
    write_atomic(path, lambda fh: fh.write(doc), what="report")
    return path


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    return str(v)
