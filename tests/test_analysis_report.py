"""Tests for core.analysis_report: figures from analysis tables, the offline HTML report, CSV tables."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from fakes import make_trace

from core.analysis import report as R
from core.analysis import tables as A
from core.errors import ForkpointError, InvalidInputError


def _traces(n=4, tags=True):
    out = []
    for s in range(n):
        t = make_trace(60, s)
        if tags:
            t = t.annotate(tags=["plan" if i % 9 == 0 else "execute" for i in range(len(t))])
        out.append(t)
    return out


def _evil_trace():
    """A trace whose top-scoring token is markup: it must reach the report escaped."""
    t = make_trace(40, 7)
    tokens = list(t.tokens)
    tokens[5] = "<script>alert(1)</script>"
    ce = np.zeros(40)
    ce[5] = 99.0
    metrics = {**t.metrics, "cross_entropy": ce}
    return dataclasses.replace(t, tokens=tokens, metrics=metrics).annotate(tags=["execute"] * 40)


def test_figures_build():
    ts = _traces()
    figs = [
        R.lorenz_figure(A.lorenz(ts)),
        R.position_density_figure(A.position_density(ts)),
        R.entropy_iou_figure(A.entropy_iou(ts)),
        R.enrichment_figure(A.enrichment(ts)),
        R.roc_figure(A.roc_curve(ts, stat="max"), A.failure_auroc(ts, stat="max")),
        R.reason_rank_figure(A.reason_rank(ts)),
    ]
    assert all(isinstance(f, go.Figure) and len(f.data) >= 1 for f in figs)
    assert "AUROC" in figs[4].data[1].name
    assert len(figs[0].data) == 1 + 4 + 1  # diagonal, per-trace curves, pooled


def test_recovery_figure():
    df = pd.DataFrame({"policy": ["guided", "guided", "random"], "rho": [0.13, 0.04, 0.25], "recovery": [1.57, 0.91, 0.3]})
    fig = R.recovery_figure(df)
    assert [d.name for d in fig.data] == ["guided", "random"]
    assert list(fig.data[0].x) == [0.04, 0.13]  # sorted by rho
    with pytest.raises(InvalidInputError, match="recovery"):
        R.recovery_figure(df.drop(columns=["recovery"]))
    # y = 1 names the reference actually used, never a hard-wired "same-size thinking model"
    labelled = R.recovery_figure(df, reference="policy reason")
    texts = [a.text for a in labelled.layout.annotations]
    assert texts == ["recovery 1 = policy reason"] and "thinking" not in labelled.layout.title.text
    assert [a.text for a in fig.layout.annotations] == ["recovery 1 = reference"]


def test_report_html_offline_and_escaped(tmp_path):
    path = str(tmp_path / "report.html")
    R.report_html([*_traces(), _evil_trace()], path)
    doc = open(path, encoding="utf-8").read()
    assert doc.count("<script src=") == 0  # nothing fetched from a CDN
    assert doc.count("plotly.js v") == 1  # the library is embedded once
    assert "<script>alert(1)" not in doc
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in doc
    from core.analysis.registry import list_analyses

    for heading in [s.label for s in list_analyses() if s.figure and not s.options and s.name != "recovery"] + [
            "Reasoner rank (all)", "Reasoner rank (spikes)", "decision pairs"]:
        assert f"<h2>{heading}</h2>" in doc, heading
    with pytest.raises(ForkpointError, match="exists"):
        R.report_html(_traces(), path)
    R.report_html(_traces(1), path, overwrite=True, segment="think")


def test_report_tables_write_csv(tmp_path):
    tables = R.report_tables(_traces(), str(tmp_path))
    for name, df in tables.items():
        back = pd.read_csv(os.path.join(tmp_path, f"{name}.csv"))
        assert list(back.columns) == list(df.columns) and len(back) == len(df)
    assert "enrichment" in tables and "decision_pairs" in tables


def test_report_skips_enrichment_without_tagger(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "core.annotate.planning", None)  # import fails -> enrichment skipped
    tables = R.report_tables(_traces(tags=False))
    assert "enrichment" not in tables and "gini" in tables
