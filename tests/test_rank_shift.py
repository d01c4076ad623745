"""core/annotate/rank_shift.py: categories from hand-set ranks, ratios, the spikes/takeovers table, the metric itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from app.state import DATASET_TAB_KEY
from core.annotate import rank_shift as rs
from core.errors import InvalidInputError
from tests.apptest import first_trace, tiny_app
from tests.fakes import make_trace


def _with_ranks(ranks, seed=0, **kw):
    trace = make_trace(n_tokens=len(ranks), seed=seed, **kw)
    trace.metrics[rs.METRIC] = np.asarray(ranks, dtype=np.int64)
    return trace


def test_categories_by_hand():
    cats = rs.categorise([0, 1, 2, 3, 4, 99, -1, np.nan])
    assert cats.tolist() == ["unshifted", "marginal", "marginal", "shifted", "shifted", "shifted", "", ""]


def test_counts_and_ratios_by_hand():
    trace = _with_ranks([0, 0, 0, 1, 2, 3, 7, 0])  # 4 unshifted, 2 marginal, 2 shifted
    assert rs.counts(rs.rank_shift(trace)) == {"unshifted": 4, "marginal": 2, "shifted": 2}
    assert rs.shifted_ratio(trace) == pytest.approx(2 / 8)
    assert rs.shifted_ratio(trace, positions=[5, 6, 0]) == pytest.approx(2 / 3)
    assert np.isnan(rs.shifted_ratio(trace, positions=[]))
    other = _with_ranks([5, 5], seed=1)
    assert rs.shifted_ratio([trace, other]) == pytest.approx(4 / 10)  # pooled, not a mean of ratios
    table = rs.per_trace_table([trace, other])
    assert table["shifted"].tolist() == [2, 2]
    assert table["shifted_share"].tolist() == pytest.approx([0.25, 1.0])
    assert table["marginal_share"].tolist() == pytest.approx([0.25, 0.0])
    with pytest.raises(InvalidInputError, match="choose one of"):
        rs.ratio({"unshifted": 1, "marginal": 0, "shifted": 0}, "shiftd")


def test_at_spikes_and_takeovers():
    trace = _with_ranks([0, 1, 5, 0, 2, 9])
    trace.source = np.array(["base", "reason", "base", "base", "forced", "reason"], dtype=object)
    trace = trace.annotate(spikes={"rule": {"top": 0.5}, "positions": [0, 2, 5]})
    table = rs.at_positions([trace]).set_index("group")
    assert table.loc["all tokens", ["unshifted", "marginal", "shifted"]].tolist() == [2, 2, 2]
    assert table.loc["spikes", ["unshifted", "marginal", "shifted"]].tolist() == [1, 0, 2]
    # takeovers are the reasoner's tokens (1 and 5); the forced token at 4 is the user's
    assert table.loc["takeovers", ["unshifted", "marginal", "shifted"]].tolist() == [0, 1, 1]
    assert table.loc["takeovers", "shifted_share"] == pytest.approx(1 / 2)
    assert table.loc["spikes", "n"] == 3


def test_colours_and_legend_are_categorical():
    trace = _with_ranks([0, 2, 4])
    assert rs.colours(trace) == [rs.COLOURS["unshifted"], rs.COLOURS["marginal"], rs.COLOURS["shifted"]]
    assert len({rs.COLOURS[c] for c in rs.CATEGORIES}) == 3
    legend = rs.swatches_html()
    for c in rs.CATEGORIES:
        assert rs.COLOURS[c] in legend


@hsettings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=-1, max_value=50), max_size=40))
def test_categories_partition_known_tokens(ranks):
    cats = rs.categorise(ranks)
    c = rs.counts(cats)
    assert sum(c.values()) == sum(1 for r in ranks if r >= 0)
    assert c["shifted"] == sum(1 for r in ranks if r > 2)
    assert c["unshifted"] == sum(1 for r in ranks if r == 0)


def test_metric_it_reads_is_the_base_rank_of_the_reasoner_top():
    """The categories sit on `reason_top_rank_in_base`: check it against a float64 argsort of random logits."""
    from core.scoring.metrics import chunk_metrics

    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(50, 30, generator=g, dtype=torch.float64), torch.randn(50, 30, generator=g, dtype=torch.float64)
    m = chunk_metrics(a, b, None, k=5)
    top_r = b.argmax(-1)
    order = torch.argsort(a, dim=-1, descending=True)
    want = [int((order[t] == top_r[t]).nonzero()[0, 0]) for t in range(50)]
    got = np.asarray(m[rs.METRIC]).tolist()
    assert got == want
    cats = rs.categorise(got)
    assert [c for c, r in zip(cats, want) if r == 0] == ["unshifted"] * want.count(0)


def test_at_positions_with_a_top_rule_uses_the_score():
    trace = _with_ranks([0, 1, 5, 0, 2, 9])
    trace.metrics["cross_entropy"] = np.array([0.1, 0.2, 3.0, 0.3, 0.4, 2.0], dtype=np.float32)
    table = rs.at_positions([trace], score="cross_entropy", top=2 / 6).set_index("group")
    assert table.loc["spikes", ["unshifted", "marginal", "shifted"]].tolist() == [0, 0, 2]  # positions 2 and 5


def test_the_analysis_report_has_the_rank_shift_table(tmp_path):
    from core.reports.report import report_html, report_tables

    traces = [make_trace(n_tokens=60, seed=s, annotate=True, reason_share=0.3) for s in range(3)]
    tables = report_tables(traces, score="cross_entropy", top=0.05)
    want = rs.at_positions(traces, score="cross_entropy", top=0.05)
    assert tables["rank_shift"].equals(want)
    assert tables["rank_shift"].set_index("group").loc["takeovers", "n"] == sum(t.n_takeovers for t in traces)
    path = report_html(traces, str(tmp_path / "r.html"), score="cross_entropy", top=0.05)
    page = Path(path).read_text(encoding="utf-8")
    assert "<h2>Rank shift: the table (rank shift)</h2>" in page and "shifted_share" in page


def test_heatmap_colouring_mode_is_categorical():
    import re

    from core.views.heatmap import tokens_html

    trace = _with_ranks([0, 2, 4, 1, 0])
    body = tokens_html(trace, colours=rs.colours(trace))
    assert re.findall(r"background:([^;\"]+)", body) == [rs.COLOURS[c] for c in
                                                        ("unshifted", "marginal", "shifted", "marginal", "unshifted")]
    with pytest.raises(InvalidInputError, match="colours has 2 entries for 5 tokens"):
        tokens_html(trace, colours=["#fff", "#000"])


def test_exports_carry_a_per_token_rank_shift_column(tmp_path):
    import pandas as pd
    import pyarrow.parquet as pq

    from core.views.exports import export

    trace = _with_ranks([0, 1, 2, 3, 0, 7])
    want = ["unshifted", "marginal", "marginal", "shifted", "unshifted", "shifted"]
    assert trace.frame()["rank_shift"].tolist() == want
    export(trace, tmp_path / "t.csv")
    assert pd.read_csv(tmp_path / "t.csv")["rank_shift"].tolist() == want
    export(trace, tmp_path / "t.parquet")
    assert pq.read_table(tmp_path / "t.parquet").column("rank_shift").to_pylist() == want
    import json

    export(trace, tmp_path / "t.jsonl")
    record = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert record["rank_shift"] == want


def test_rank_shift_is_a_colour_scale_of_the_heatmap():
    import re

    from core.views.heatmap import SCALES, legend_html, tokens_html

    assert rs.NAME in SCALES  # the app's colour-scale selector and URL state read SCALES
    trace = _with_ranks([3, 0, 1])
    body = tokens_html(trace, scale=rs.NAME)
    assert re.findall(r"background:([^;\"]+)", body) == [rs.COLOURS["shifted"], rs.COLOURS["unshifted"],
                                                        rs.COLOURS["marginal"]]
    legend = legend_html(scale=rs.NAME)
    assert all(rs.COLOURS[c] in legend for c in rs.CATEGORIES) and "linear-gradient" not in legend


@pytest.mark.slow
def test_the_app_colours_by_rank_shift(tiny_dirs, tmp_path, monkeypatch):
    at = first_trace(tiny_app(tiny_dirs, tmp_path, monkeypatch))
    at.selectbox(key="scale").set_value(rs.NAME).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    legends = [h.proto.body for h in at.get("html") if "rank shift of the reasoner" in h.proto.body]
    assert legends and all(rs.COLOURS[c] in legends[0] for c in rs.CATEGORIES)
    assert at.query_params["scale"] == [rs.NAME] or at.query_params["scale"] == rs.NAME
    # the Dataset page's rank-shift tab
    at.switch_page("screens/dataset.py")
    at.session_state[DATASET_TAB_KEY] = "Rank shift"  # a lazy tab: only the open one runs
    at.run()
    assert not at.exception and not at.error
    ids = [c.proto.id for c in at.get("plotly_chart")]
    assert any(i.endswith("-ds_fig_rank_shift") for i in ids), ids
