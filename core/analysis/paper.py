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

from core.analysis import report as R
from core.evaluation.harness import add_recovery
from core.io.atomic import write_atomic

AVERAGE = "average"
# The paper's main table (Qwen3-0.6B-Base guided by Qwen3-8B; average over its benchmarks), as in docs/REPRODUCE.md.
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
METRIC_COLUMNS = ("accuracy", "pass@k", "recovery@k", "rho")


def setting_label(row: Mapping[str, Any]) -> str:
    """A readable row name: "base alone", "guided r=0.05", "random positions (ρ of guided r=0.05)"."""
    policy, config = str(row["policy"]), str(row.get("config", row["policy"]))
    if policy in END_LABELS and config == policy:
        return END_LABELS[policy]
    if policy == "guided":
        return f"guided {config}"
    return f"{policy.replace('_', ' ')} (ρ of guided {config})"


def paper_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """Long table: setting, benchmark (each, plus "average"), accuracy, pass@k, rho, recovery@k, recovery.

    The average row averages accuracy, pass@k and ρ over benchmarks and computes recovery from those
    averages (as the paper's 91% = (61.4 − 36.0) / (64.1 − 36.0)); reference = the sweep's reference."""

    df = sweep.assign(setting=[setting_label(r) for _, r in sweep.iterrows()])
    keep = ["setting", "policy", "config", "benchmark", "accuracy", "pass@k", "rho", "mean_tokens", "k"]
    long = df[keep].copy()
    if long["benchmark"].nunique() > 1:
        avg = (long.groupby(["setting", "policy", "config"], sort=False)[["accuracy", "pass@k", "rho", "mean_tokens"]]
               .mean().reset_index().assign(benchmark=AVERAGE, k=int(long["k"].min())))
        long = pd.concat([long, avg[keep]], ignore_index=True)
    reference = _reference_of(sweep)
    ends = long[long["policy"] == long["config"]]
    return add_recovery(long, base="base", reference=reference, ends=ends)


def _reference_of(sweep: pd.DataFrame) -> Any:
    """The reference the sweep used: a policy label, else the given numbers (per benchmark)."""
    names = set(sweep.get("reference", pd.Series(dtype=str)).dropna())
    labels = {n.removeprefix("policy ").removesuffix(" (missing)") for n in names if n.startswith("policy ")}
    if labels:
        return labels.pop()
    return sweep.attrs.get("reference_numbers", math.nan)


def paper_table_html(table: pd.DataFrame) -> str:
    """The main table as HTML: one row per setting, per benchmark "acc / Pass@k / rec@k / ρ" cells."""
    benches = list(dict.fromkeys(table["benchmark"]))
    k = int(table["k"].min()) if len(table) else 1
    head = "".join(f"<th colspan=4>{html.escape(str(b))}</th>" for b in benches)
    sub = "".join(f"<th>acc</th><th>Pass@{k}</th><th>recovery@{k}</th><th>ρ</th>" for _ in benches)
    rows = []
    for setting in dict.fromkeys(table["setting"]):
        cells = []
        for b in benches:
            part = table[(table["setting"] == setting) & (table["benchmark"] == b)]
            vals = part.iloc[0] if len(part) else None
            cells += [_pct(vals, "accuracy"), _pct(vals, "pass@k"), _pct(vals, "recovery@k"), _num(vals, "rho")]
        rows.append(f"<tr><td>{html.escape(str(setting))}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (f"<table><tr><th rowspan=2>setting</th>{head}</tr><tr>{sub}</tr>" + "".join(rows) + "</table>")


def _pct(row: Any, col: str) -> str:
    v = float("nan") if row is None else float(row[col])
    return "–" if math.isnan(v) else f"{100 * v:.1f}%"


def _num(row: Any, col: str) -> str:
    v = float("nan") if row is None else float(row[col])
    return "–" if math.isnan(v) else f"{v:.3f}"


def headline(analyses: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per headline finding: this run's value beside the paper's (analyses from `report_tables`)."""
    def pick(name: str, col: str, where: Callable[[pd.DataFrame], pd.Series]) -> float:
        df = analyses.get(name)
        if df is None or df.empty:
            return math.nan
        rows = df[where(df)]
        return float(rows[col].iloc[0]) if len(rows) else math.nan

    out = [
        ("Gini of the score (pooled)", pick("gini", "gini", lambda d: d["trace"] == "pooled"), "≈ 0.94"),
        ("share of tokens holding 80% of the score mass", pick("mass_fraction", "fraction",
                                                               lambda d: d["trace"] == "pooled"),
         "~8% of tokens carry the salient disagreement (threshold not given)"),
        ("median position u = t/T of the top-1% tokens",
         float(analyses["position_density"].attrs.get("median_u", math.nan)) if "position_density" in analyses
         else math.nan, "early (density peak near 0.05)"),
        ("IoU of top-10% score and top-10% base-entropy tokens", pick("entropy_iou", "iou", lambda d: d["p"] == 0.1),
         "high for all p"),
        ("failure AUROC, top-100 mean score", pick("failure_auroc", "auroc", lambda d: d["signal"] != "entropy_base"),
         "0.851 (GSM8K)"),
        ("failure AUROC, top-100 mean base entropy", pick("failure_auroc", "auroc",
                                                          lambda d: d["signal"] == "entropy_base"), "0.817 (GSM8K)"),
        ("reasoner's top token within the base top-5 (spikes)",
         pick("reason_rank_within", "share", lambda d: (d["at"] == "spikes") & (d["k"] == 5)), "always (ReasonMaxxer)"),
        ("planning enrichment among tokens taken over", pick("enrichment", "enrichment",
                                                             lambda d: (d["set"] == "taken_over") & (d["category"] == "planning")),
         "≈ 17.6×"),
    ]
    return pd.DataFrame(out, columns=["finding", "this run", "paper"])


def recovery_vs_rho_figure(table: pd.DataFrame, reference_name: str) -> go.Figure:
    """Recovery@k against realised ρ on the average (or only) benchmark, one line per policy family."""
    bench = AVERAGE if AVERAGE in set(table["benchmark"]) else table["benchmark"].iloc[0]
    part = table[(table["benchmark"] == bench) & (table["config"] != table["policy"])]
    fig = go.Figure()
    for policy in dict.fromkeys(part["policy"]):
        rows = part[part["policy"] == policy].sort_values("rho")
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
    figures += [("Sparsity: Lorenz curve (base rollouts)", R.lorenz_figure(analyses["lorenz"])),
                ("Position of the top-1% tokens", R.position_density_figure(analyses["position_density"])),
                ("Disagreement vs base uncertainty", R.entropy_iou_figure(analyses["entropy_iou"]))]
    if "enrichment" in analyses:
        figures.append(("Planning tokens", R.enrichment_figure(analyses["enrichment"])))
    figures += [("Failure prediction", R.roc_figure(analyses["roc"], analyses["failure_auroc"])),
                ("Reasoner's top token in the base top-k", R.reason_rank_figure(analyses["reason_rank_all"]))]
    parts = [f"<h2>Main table (recovery against: {html.escape(reference)})</h2>", paper_table_html(table),
             "<h3>The paper's numbers (Qwen3-0.6B-Base + Qwen3-8B, average over its benchmarks)</h3>",
             paper_table_html(PAPER_NUMBERS.assign(benchmark="paper average", k=8)),
             "<h2>Headline analyses against the paper</h2>", R._table_html(headline(analyses))]
    for i, (heading, fig) in enumerate(figures):
        parts.append(f"<h2>{html.escape(heading)}</h2>\n" + fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    for name in ("gini", "mass_fraction", "entropy_iou", "failure_auroc", "reason_rank_within", "enrichment"):
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
