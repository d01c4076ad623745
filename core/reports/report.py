"""Figures for `core.analysis` tables, and the offline report (one HTML file, or a folder of CSVs).

Each `*_figure` takes the DataFrame its analysis function returns and gives a plotly figure. The HTML
report embeds plotly's JavaScript once (no CDN) and escapes every piece of model text.
"""

from __future__ import annotations

import html
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from core import settings
from core.analysis import tables as A
from core.analysis.registry import figure_table_names, list_analyses
from core.analysis.views import as_list
from core.errors import ForkpointError, InvalidInputError, OutputExistsError
from core.io.atomic import write_atomic
from core.io.csvsafe import write_csv
from core.io.stored_traces import StoredTraces
from core.scoring.registry import DEFAULT_SCORE
from core.trace import Trace

log = logging.getLogger(__name__)

MAX_TRACE_CURVES = 20  # per-trace Lorenz curves drawn besides the pooled one


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, template="plotly_white", height=420)
    return fig


def lorenz_figure(df: pd.DataFrame) -> go.Figure:
    """Lorenz curves from `lorenz()`: the pooled curve bold, a few per-trace curves faint, the diagonal."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="equality", line={"dash": "dot", "color": "grey"}))
    labels = [lab for lab in df["trace"].unique() if lab != A.POOLED]
    shown = labels[:MAX_TRACE_CURVES]
    for j, lab in enumerate(shown):  # one legend entry for all of them; each names its trace on hover
        part = df[df["trace"] == lab]
        fig.add_trace(go.Scatter(x=part["x"], y=part["y"], mode="lines", name=f"per trace ({len(shown)} of {len(labels)})",
                                 legendgroup="traces", showlegend=j == 0, opacity=0.35, line={"width": 1},
                                 hovertext=str(lab)[:12], hoverinfo="text+x+y"))
    part = df[df["trace"] == A.POOLED]
    if len(part):
        fig.add_trace(go.Scatter(x=part["x"], y=part["y"], mode="lines", name=A.POOLED, line={"width": 3, "color": "black"}))
    return _layout(fig, "Lorenz curve of the disagreement score", "share of tokens (lowest score first)", "share of score mass")


def position_density_figure(df: pd.DataFrame) -> go.Figure:
    """Bars of the top-token density over u = t/T from `position_density()`, with the uniform line."""
    centres = (df["bin_left"] + df["bin_right"]) / 2
    fig = go.Figure()
    fig.add_trace(go.Bar(x=centres, y=df["density"], width=df["bin_right"] - df["bin_left"], name="top tokens"))
    fig.add_trace(go.Scatter(x=[0, 1], y=[1, 1], mode="lines", name="uniform", line={"dash": "dot", "color": "grey"}))
    median = df.attrs.get("median_u", float("nan"))
    title = f"Where the top tokens are (median u = {median:.3f}, n = {df.attrs.get('n', 0)})"
    return _layout(fig, title, "normalised position u = t/T", "density")


def entropy_iou_figure(df: pd.DataFrame) -> go.Figure:
    """IoU of top-p% score tokens with top-p% base-entropy tokens against p, from `entropy_iou()`."""
    fig = go.Figure(go.Scatter(x=df["p"], y=df["iou"], mode="lines+markers", name="IoU"))
    fig.update_xaxes(type="log")
    fig.update_yaxes(range=[0, 1.05])
    return _layout(fig, "Overlap of top disagreement and top base-entropy tokens", "top fraction p", "IoU")


def enrichment_figure(df: pd.DataFrame) -> go.Figure:
    """Grouped bars of each category's enrichment per token set, from `enrichment()`."""
    fig = go.Figure()
    for name in [s for s in df["set"].unique() if s != "all"]:
        part = df[df["set"] == name]
        fig.add_trace(go.Bar(x=part["category"], y=part["enrichment"], name=name))
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(barmode="group")
    return _layout(fig, "Enrichment of tag categories (share / share among all tokens)", "category", "enrichment")


def roc_figure(df: pd.DataFrame, aurocs: pd.DataFrame | None = None) -> go.Figure:
    """ROC curves of the failure predictor from `roc_curve()`; AUROCs from `failure_auroc()` in the legend."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="chance", line={"dash": "dot", "color": "grey"}))
    for signal in df["signal"].unique():
        part = df[df["signal"] == signal]
        name = str(signal)
        if aurocs is not None and (aurocs["signal"] == signal).any():
            name += f" (AUROC {float(aurocs.loc[aurocs['signal'] == signal, 'auroc'].iloc[0]):.3f})"
        fig.add_trace(go.Scatter(x=part["fpr"], y=part["tpr"], mode="lines+markers", name=name, line_shape="linear"))
    return _layout(fig, "Predicting a wrong answer from the response's scores", "false positive rate", "true positive rate")


def reason_rank_figure(df: pd.DataFrame, title: str = "Base rank of the reasoner's top token") -> go.Figure:
    """Bars of `reason_rank()` shares by rank bucket, with the cumulative share as a line."""
    fig = go.Figure()
    fig.add_trace(go.Bar(x=df["label"], y=df["share"], name="share"))
    fig.add_trace(go.Scatter(x=df["label"], y=df["cum_share"], mode="lines+markers", name="cumulative"))
    fig.update_yaxes(range=[0, 1.05])
    return _layout(fig, title, "rank under the base model (0 = top)", "share of positions")


def recovery_figure(df: pd.DataFrame, reference: str = "reference") -> go.Figure:
    """Recovery against takeover rate, one line per policy: needs columns policy, rho, recovery.
    `reference` names what recovery = 1 is (e.g. "same-size thinking model", "policy reason")."""
    missing = [c for c in ("policy", "rho", "recovery") if c not in df.columns]
    if missing:
        raise InvalidInputError(f"recovery_figure needs columns policy, rho, recovery; missing: {', '.join(missing)}")
    fig = go.Figure()
    for policy in df["policy"].unique():
        part = df[df["policy"] == policy].sort_values("rho")
        fig.add_trace(go.Scatter(x=part["rho"], y=part["recovery"], mode="lines+markers", name=str(policy)))
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey", annotation_text=f"recovery 1 = {reference}")
    fig.add_hline(y=0.0, line_dash="dot", line_color="lightgrey")
    return _layout(fig, f"Recovery of the gap to {reference} vs. takeover rate", "takeover rate ρ", "recovery")


# -- the whole report ---------------------------------------------------------------------------


def _keeping(items: Sequence[Trace], keep_gib: float) -> Sequence[Trace]:
    """Stored traces that keep up to `keep_gib` GiB of what they read (a report scans them once per analysis)."""
    if not isinstance(items, StoredTraces):
        return items
    return items.keeping(settings.gib_bytes(settings.SETTINGS["report_keep_gib"].check(keep_gib, "keep_gib")))


def report_tables(
    traces: Sequence[Trace],
    outdir: str | None = None,
    score: str = DEFAULT_SCORE,
    top: float = settings.SPIKE_TOP,
    segment: str | None = None,
    only: Sequence[str] | None = None,
    keep_gib: float = settings.REPORT_KEEP_GIB,
) -> dict[str, pd.DataFrame]:
    """Every table of every registered analysis (core/analysis/registry.py), by name; written as
    `<outdir>/<name>.csv` when `outdir` is given. An analysis that cannot run on these traces (e.g.
    enrichment without tags and no tagger) is skipped with a logged warning. `only`: these analyses' names.
    A lazy sequence (`StoredTraces`) stays lazy: each analysis reads the traces in a pass of its own, and the
    first `keep_gib` GiB of them read are kept for the later passes (0: one or two traces in memory at once)."""
    items = _keeping(as_list(traces), keep_gib)
    tables: dict[str, pd.DataFrame] = {}
    for spec in list_analyses():
        if only is not None and spec.name not in only:
            continue
        try:
            tables.update(spec.run(items, score, top, segment))
        except (ForkpointError, ImportError, OSError) as exc:
            log.warning("%s skipped: %s", spec.name, str(exc))  # not exc: its traceback holds a trace
    if outdir is not None:
        os.makedirs(outdir, exist_ok=True)
        for name, df in tables.items():
            write_csv(df, os.path.join(outdir, f"{name}.csv"))
        log.info("wrote %d analysis tables to %s", len(tables), outdir)
    return tables


def figures(tables: dict[str, pd.DataFrame]) -> list[tuple[str, str, go.Figure]]:
    """(heading, what it shows, figure) of every registered analysis whose tables are present (one per option
    value)."""
    out = []
    for spec in list_analyses():
        if spec.figure is None:
            continue
        choices = [{}] if not spec.options else [{k: v} for k, values in spec.options.items() for v in values]
        for choice in choices:
            names = figure_table_names(spec, **choice)
            if all(n in tables for n in names):
                heading = spec.label + "".join(f" ({v})" for v in choice.values())
                out.append((heading, spec.help, globals()[spec.figure](*[tables[n] for n in names])))
    return out


ALL_BENCHMARKS = "all"  # the `benchmark` of analyses pooled over every benchmark


def benchmark_tables(groups: dict[str, Sequence[Trace]], outdir: str | None = None, score: str = DEFAULT_SCORE,
                     top: float = settings.SPIKE_TOP, keep_gib: float = settings.REPORT_KEEP_GIB,
                     only: Sequence[str] | None = None) -> dict[str, pd.DataFrame]:
    """`report_tables` per benchmark ({benchmark: traces}) and, with several, pooled over all of them
    (benchmark "all"): every table gains a leading `benchmark` column, plus "position_summary" (benchmark,
    n, median_u, peak_u of the top-`top` tokens). Written as `<outdir>/<name>.csv` when `outdir` is given.
    `only`: these analyses' names."""
    runs = {name: as_list(ts) for name, ts in groups.items() if len(ts)}
    if len(runs) > 1:
        runs[ALL_BENCHMARKS] = pooled(list(runs.values()))
    parts: dict[str, list[pd.DataFrame]] = {}
    summary = []
    for bench, items in runs.items():
        for name, df in report_tables(items, None, score=score, top=top, only=only, keep_gib=keep_gib).items():
            parts.setdefault(name, []).append(df.assign(benchmark=bench)[["benchmark", *df.columns]])
            if name == "position_density":
                summary.append({"benchmark": bench, "n": df.attrs.get("n", 0), "median_u": df.attrs.get("median_u"),
                                "peak_u": df.attrs.get("peak_u")})
    tables = {name: pd.concat(frames, ignore_index=True) for name, frames in parts.items()}
    tables["position_summary"] = pd.DataFrame(summary, columns=["benchmark", "n", "median_u", "peak_u"])
    if outdir is not None:
        os.makedirs(outdir, exist_ok=True)
        for name, df in tables.items():
            write_csv(df, os.path.join(outdir, f"{name}.csv"))
    return tables


def pooled(parts: Sequence[Sequence[Trace]]) -> Sequence[Trace]:
    """Every part's traces in one sequence: StoredTraces of one store stay keys (read one at a time)."""
    parts = [p for p in parts if len(p)]
    if parts and all(isinstance(p, StoredTraces) and p.store is parts[0].store for p in parts):
        return StoredTraces(parts[0].store, [k for p in parts for k in p.keys])  # type: ignore[attr-defined]
    return [t for p in parts for t in p]


def main_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of a `benchmark_tables` table that figures show: pooled over all benchmarks when there are
    several, else the only one's (a table without a `benchmark` column as it is)."""
    if "benchmark" not in df.columns or df.empty:
        return df
    names = list(dict.fromkeys(df["benchmark"]))
    bench = ALL_BENCHMARKS if ALL_BENCHMARKS in names else names[0]
    return df[df["benchmark"] == bench].drop(columns="benchmark").reset_index(drop=True)


def _table_html(df: pd.DataFrame, max_rows: int = 50) -> str:
    shown = df.head(max_rows)
    note = f"<p class='note'>showing {len(shown)} of {len(df)} rows</p>" if len(df) > max_rows else ""
    table = shown.to_html(index=False, escape=True, na_rep="–", float_format=lambda v: f"{v:.4g}", border=0)
    return f"<div class='scroll'>{table}</div>{note}"  # a wide table scrolls inside the page, not the page


def report_html(
    traces: Sequence[Trace],
    path: str,
    score: str = DEFAULT_SCORE,
    top: float = settings.SPIKE_TOP,
    segment: str | None = None,
    overwrite: bool = False,
    outdir: str | None = None,
    only: Sequence[str] | None = None,
    keep_gib: float = settings.REPORT_KEEP_GIB,
) -> str:
    """Write a self-contained HTML report (plotly JS embedded once, works offline); returns the path.
    With `outdir`, the same tables are also written there as CSV (see `report_tables`)."""
    if os.path.exists(path) and not overwrite:
        raise OutputExistsError(f"{path} exists; overwrite=True (CLI: --overwrite) replaces it")
    items = _keeping(as_list(traces), keep_gib)  # the header's token count reads them once more
    tables = report_tables(items, outdir, score=score, top=top, segment=segment, only=only, keep_gib=keep_gib)
    parts = []
    for i, (heading, about, fig) in enumerate(figures(tables)):
        body = fig.to_html(full_html=False, include_plotlyjs=(i == 0))
        parts.append(f"<h2>{html.escape(heading)}</h2>\n<p class='note'>{html.escape(about)}</p>\n{body}")
    for spec in list_analyses():
        if spec.detail in tables and spec.detail != "decision_pairs":
            parts.append(f"<h2>{html.escape(spec.label)}: the table ({html.escape(spec.detail.replace('_', ' '))})"
                         f"</h2>\n{_table_html(tables[spec.detail])}")
    if "decision_pairs" in tables:
        pairs = tables["decision_pairs"].copy()
        pairs["prefix"] = pairs["prefix"].map(lambda s: ("…" + s[-80:]) if len(s) > 80 else s)
        spec = next(a for a in list_analyses() if a.name == "decision_pairs")
        parts.append(f"<h2>{html.escape(spec.label)}</h2>\n<p class='note'>{html.escape(spec.help)}</p>\n"
                     f"{_table_html(pairs)}")
    seg = segment or "whole response"
    header = (
        f"<h1>forkpoint analysis</h1><p>{len(items)} traces, {sum(len(t) for t in items)} tokens; "
        f"score <code>{html.escape(score)}</code>, top {top:g}, segment {html.escape(seg)}</p>"
    )
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;font-size:13px}td,th{padding:2px 8px;border-bottom:1px solid #ddd}"
        ".scroll{overflow-x:auto;max-width:100%}"
        ".note{color:#666;font-size:12px}"
    )
    doc = (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>forkpoint analysis</title>"
        f"<style>{style}</style></head><body>\n{header}\n" + "\n".join(parts) + "\n</body></html>\n"
    )
    write_atomic(Path(path), lambda fh: fh.write(doc), what="analysis report")
    log.info("wrote analysis report for %d traces to %s", len(items), path)
    return path
