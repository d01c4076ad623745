"""The gate shoot-out as a page: its table and its Pareto plots (recovery against realised ρ, recovery against
the reasoner's cost), one self-contained HTML file (plotly's JavaScript embedded once; every text escaped).
The table comes from `core.compare_gates` (core/evaluation/gates.py); the same figures serve the app's
Dataset tab and `forkpoint reproduce`'s section.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from core.reports.report import _table_html
from core.io.atomic import write_atomic

ENDS = ("base", "reason", "thinking")
SHOWN = ("label", "benchmark", "target_rho", "calibrated_rho", "rho", "accuracy", "pass@k", "recovery", "recovery@k",
         "wrong_to_right", "right_to_wrong", "reason_evals_per_token", "reason_forwards_per_token", "wall_s_per_token",
         "knob", "knob_value")
NOTE = ("Each gate's knob is set by one equal-ρ calibration on base rollouts of held-out problems (target ρ); "
        "calibrated ρ is the share of those rollouts' tokens where it would fire, ρ the share it took over when "
        "run. Flips: problems (right = at least half the samples correct) the base got wrong and the gate right "
        "(wrong_to_right), and the reverse. reason_evals_per_token: the reasoner's evaluations decoding needs per "
        "token (a lazy gate asks it only where it fires; Guided and the random / early baselines score every "
        "position). reason_forwards_per_token: the reasoner's forwards of one row counted while decoding, per token "
        "(one forward reads a block of positions, so it can be below the evaluations; – where the traces came from "
        "the store or from an executor's workers, and nothing was counted). wall_s_per_token: the decoding "
        "seconds the traces record, per generated token; the machine's load moves it.")


def recovery_column(table: pd.DataFrame) -> str:
    """The y of the Pareto plots: recovery@k when any row has it, else recovery, else accuracy (the reference
    does not beat the base: recovery is undefined)."""
    for col in ("recovery@k", "recovery"):
        if col in table and table[col].notna().any():
            return col
    return "accuracy"


def pareto_figure(table: pd.DataFrame, x: str, title: str, x_title: str) -> go.Figure:
    """One line per gate over target ρ: `recovery_column` against `x` (the average, or the only benchmark)."""
    y = recovery_column(table)
    gates = table[~table["label"].isin(ENDS)]
    fig = go.Figure()
    for gate in dict.fromkeys(gates["gate"]):
        rows = gates[gates["gate"] == gate].sort_values(x)
        fig.add_trace(go.Scatter(x=rows[x], y=rows[y], mode="lines+markers", name=str(gate), text=rows["label"],
                                 hovertemplate="%{text}: " + x + "=%{x:.4g}, " + y + "=%{y:.3f}"))
    for end in ENDS:
        row = table[table["label"] == end]
        if len(row) and not math.isnan(float(row[y].iloc[0])) and y == "accuracy":
            fig.add_hline(y=float(row[y].iloc[0]), line_dash="dot", line_color="grey", annotation_text=end)
    if y != "accuracy":
        fig.add_hline(y=1.0, line_dash="dot", line_color="grey", annotation_text="reference")
        fig.add_hline(y=0.0, line_dash="dot", line_color="lightgrey", annotation_text="base")
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y, template="plotly_white", height=400)
    return fig


def gates_figures(summary: pd.DataFrame) -> list[tuple[str, go.Figure]]:
    """(heading, figure) of the shoot-out: recovery vs realised ρ, vs reasoner evaluations, vs wall time."""
    out = [("Recovery vs realised takeover rate",
            pareto_figure(summary, "rho", "Which gate knows when: recovery at equal ρ", "realised ρ")),
           ("Recovery vs the reasoner's cost",
            pareto_figure(summary, "reason_evals_per_token", "Recovery vs reasoner evaluations per token",
                          "reasoner evaluations per token"))]
    if summary["wall_s_per_token"].notna().any():
        out.append(("Recovery vs wall time", pareto_figure(summary, "wall_s_per_token", "Recovery vs wall time",
                                                          "wall seconds per token")))
    return out


def gates_table_html(table: pd.DataFrame) -> str:
    """The shoot-out's table (the columns that matter, escaped)."""
    return _table_html(table[[c for c in SHOWN if c in table.columns]], max_rows=500)


def gates_section(summary: pd.DataFrame, include_plotlyjs: bool = True) -> str:
    """The shoot-out as an HTML fragment (a report's section): note, table, figures."""
    y = recovery_column(summary)
    why = ("" if y != "accuracy" else "<p class='note'>Recovery is undefined here: the reference does not beat "
           "the base, so the plots show accuracy.</p>")
    parts = [f"<p class='note'>{html.escape(NOTE)}</p>", why, gates_table_html(summary)]
    for i, (heading, fig) in enumerate(gates_figures(summary)):
        parts.append(f"<h3>{html.escape(heading)}</h3>\n"
                     + fig.to_html(full_html=False, include_plotlyjs=include_plotlyjs and i == 0))
    return "\n".join(parts)


def gates_html(path: str, summary: pd.DataFrame, table: pd.DataFrame, info: Mapping[str, Any]) -> str:
    """Write the self-contained shoot-out page to `path` (replacing it): the summary (average over benchmarks)
    with its plots, then every benchmark's rows, then the run's settings. Returns the path."""
    per_bench = "" if summary is table or table["benchmark"].nunique() < 2 else (
        "<h2>Per benchmark</h2>" + gates_table_html(table))
    settings_json = html.escape(json.dumps(dict(info), indent=1, default=str))
    style = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;font-size:13px}td,th{padding:2px 8px;border-bottom:1px solid #ddd}"
             ".note{color:#666;font-size:13px}")
    doc = ("<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>forkpoint gate shoot-out</title>"
           f"<style>{style}</style></head><body>\n<h1>Which gate knows when? The gate shoot-out at equal ρ</h1>\n"
           + gates_section(summary) + per_bench
           + f"<details><summary>run settings</summary><pre>{settings_json}</pre></details>\n</body></html>\n")
    write_atomic(path, lambda fh: fh.write(doc), what="gate report")
    return path
