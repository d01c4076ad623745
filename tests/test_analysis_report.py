"""Tests for core.analysis_report: figures from analysis tables, the offline HTML report, CSV tables."""

from __future__ import annotations

import dataclasses
import html
import os

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from fakes import make_trace

from core.reports import report as R
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
            "Reasoner rank (all)", "Reasoner rank (spikes)", "Decision pairs"]:
        assert f"<h2>{heading}</h2>" in doc, heading
    for spec in list_analyses():  # every section says what it shows (the registry's help), under its heading
        if spec.name != "recovery" and (spec.figure or spec.name == "decision_pairs"):
            assert f"<p class='note'>{html.escape(spec.help)}</p>" in doc, spec.name
    assert '"legendgroup":"traces"' in doc  # the per-trace Lorenz curves share one legend entry
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


class _AliveCountingStore:
    """Wraps TraceStore.get: counts the traces read and the most alive at once (a finalizer per trace)."""

    def __init__(self, monkeypatch):
        import weakref

        from core.io.store import TraceStore

        self.reads = self.alive = self.peak = 0
        original = TraceStore.get

        def get(store, key):
            trace = original(store, key)
            self.reads += 1
            self.alive += 1
            self.peak = max(self.peak, self.alive)
            weakref.finalize(trace, self._gone)
            return trace

        monkeypatch.setattr(TraceStore, "get", get)

    def _gone(self):
        self.alive -= 1


def _stored(tmp_path, n=12):
    from core.io.store import TraceStore

    store = TraceStore(tmp_path / "store")
    for s in range(n):
        store.put(make_trace(60, s, annotate=True, meta={"correct": s % 3 == 0, "answer": "1"}))
    return store


def test_report_reads_stored_traces_one_at_a_time(tmp_path, monkeypatch):
    """Analyses over a store's traces (`StoredTraces`, as `forkpoint analyze` passes them) with nothing kept
    (keep_gib=0) never hold them all: every registered analysis reads each trace in a pass of its own, at most
    two alive at once, on a store of 12 traces; the tables equal those of the same traces held in a list."""
    from core.io.stored_traces import StoredTraces

    store = _stored(tmp_path)
    keys = store.keys()
    held = [store.get(k) for k in keys]
    expected = R.report_tables(held)
    expected_bench = R.benchmark_tables({"a": held[:6], "b": held[6:]})
    del held
    counter = _AliveCountingStore(monkeypatch)
    lazy = StoredTraces(store, keys)
    tables = R.report_tables(lazy, keep_gib=0)
    assert counter.reads >= 2 * len(keys) and counter.peak <= 2, (counter.reads, counter.peak)
    assert tables.keys() == expected.keys() and len(tables) >= 8
    for name in tables:
        pd.testing.assert_frame_equal(tables[name], expected[name])
    bench = R.benchmark_tables({"a": StoredTraces(store, keys[:6]), "b": StoredTraces(store, keys[6:])}, keep_gib=0)
    for name in bench:
        pd.testing.assert_frame_equal(bench[name], expected_bench[name])
    R.report_html(lazy, str(tmp_path / "r.html"), keep_gib=0)
    assert counter.peak <= 2 and counter.alive == 0


@pytest.mark.parametrize("fit", [5, 12])
def test_a_report_reads_the_traces_that_fit_its_memory_budget_once(tmp_path, monkeypatch, fit):
    """A report keeps the first traces it reads while their sizes (estimated: `trace_bytes`) fit `keep_gib`:
    with room for `fit` of 12 traces, the 9 analyses' passes read the kept ones once and the others once a pass
    (36,000 reads of 1,500 traces took 33 of `forkpoint analyze`'s 41 s); the tables are those of a list, and
    nothing stays alive once the report is done."""
    from core.io.stored_traces import StoredTraces, trace_bytes

    store = _stored(tmp_path)
    keys = store.keys()
    held = [store.get(k) for k in keys]
    expected = R.report_tables(held)
    sizes = [trace_bytes(t) for t in held]  # in the order the first pass reads them
    assert min(sizes) > 60 * 8 * 12  # 12 float64 metrics a token at least: an estimate in bytes
    del held
    lazy = StoredTraces(store, keys)
    R.report_tables(lazy, keep_gib=0)
    counter = _AliveCountingStore(monkeypatch)
    R.report_tables(lazy, keep_gib=0)
    passes = counter.reads // len(keys)
    assert passes >= 8 and counter.reads == passes * len(keys)
    counter = _AliveCountingStore(monkeypatch)
    tables = R.report_tables(lazy, keep_gib=(sum(sizes[:fit]) + min(sizes) // 2) / 2**30)  # no room for one more
    assert counter.reads == len(keys) + (passes - 1) * (len(keys) - fit), (counter.reads, passes)
    assert counter.alive == 0
    assert tables.keys() == expected.keys()
    for name in tables:
        pd.testing.assert_frame_equal(tables[name], expected[name])


def test_cli_analyze_reads_the_store_one_trace_at_a_time(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from core.cli import main

    store = _stored(tmp_path)
    counter = _AliveCountingStore(monkeypatch)
    out = ["analyze", "--store", str(store.path), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, [*out, "--report-keep-gib", "0"])
    assert result.exit_code == 0, result.output
    assert counter.reads >= 24 and counter.peak <= 2, (counter.reads, counter.peak)
    counter = _AliveCountingStore(monkeypatch)  # the default keeps them all (12 small traces): each read once
    result = CliRunner().invoke(main, [*out, "--overwrite"])
    assert result.exit_code == 0, result.output
    assert counter.reads == 12 and counter.alive == 0, (counter.reads, counter.alive)
    assert (tmp_path / "out" / "report.html").exists()


def test_decision_pairs_in_a_report_carry_the_text_of_every_choice(qwen_pair):
    """A report has no pair loaded; the decision pairs read the tokenizer the traces record, so the rows where
    the two models choose differently (the ones that matter) have both texts, not only the emitted token's."""
    import core

    traces = core.generate(qwen_pair, ["alpha beta", "gamma delta"], core.make_policy("base_only"), max_new_tokens=24)
    table = R.report_tables(traces, only=["decision_pairs"])["decision_pairs"]
    assert len(table) and (table["base_id"] != table["reason_id"]).any()
    for side in ("base", "reason"):
        expected = [qwen_pair.tokenizer.decode([i], clean_up_tokenization_spaces=False) for i in table[f"{side}_id"]]
        assert table[f"{side}_text"].tolist() == expected
