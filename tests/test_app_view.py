"""The app's plain helpers (app/view.py, app/config.py, the token view payload): no browser, no models."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.components.token_view import build_view
from app.config import parse_args
from app.view import (
    SpikeRule, annotate_view, filter_table, first_difference, hover_data, md_code, spike_count, tail,
    takeover_choices,
    trace_table, tree_label, tree_rows,
)
from core.spike_rules import Gate, top_count
from core.errors import InvalidInputError
from core.io.store import TraceStore
from fakes import fake_decode, make_trace


# -- config --------------------------------------------------------------------------------------


def test_parse_args_defaults_to_demo_pair():
    cfg = parse_args([])
    assert cfg.pair.demo and cfg.store is None and cfg.problems is None and cfg.max_new_tokens == 256


def test_parse_args_pair_store_and_formats():
    cfg = parse_args(["--base", "a/b", "--reason", "c/d", "--store", "/s", "--reason-format", "chat:think",
                      "--max-new-tokens", "32"])
    assert not cfg.pair.demo and cfg.pair.base == "a/b" and cfg.pair.reason == "c/d"
    assert cfg.store == "/s" and cfg.pair.reason_format == "chat:think" and cfg.max_new_tokens == 32
    assert cfg.pair.label() == "b | d"


@pytest.mark.parametrize("argv, needle", [
    (["--base", "a"], "both --base and --reason"),
    (["--bogus", "1"], "Unknown app arguments: --bogus"),
    (["--max-new-tokens", "0"], "max-new-tokens"),
])
def test_parse_args_errors_name_the_problem(argv, needle):
    with pytest.raises(InvalidInputError, match=re.escape(needle)):
        parse_args(argv)


@pytest.mark.parametrize("text", ["42", "![x](http://e.x/a.png)", "a `b` c", "line\nbreak **bold**", "", "x" * 200])
def test_md_code_is_one_literal_code_span(text):
    out = md_code(text)
    assert out.startswith("`") and out.endswith("`") and out.count("`") == 2 and "\n" not in out
    assert len(out) <= 82


# -- branches ------------------------------------------------------------------------------------


def _with_ids(trace, ids):
    out = trace.head(len(ids))
    out.token_ids = np.asarray(ids, dtype=np.int64)
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12), st.integers(0, 14))
def test_first_difference_matches_a_scan(a_ids, b_ids, start):
    base = make_trace(12, seed=1)
    a, b = _with_ids(base, a_ids), _with_ids(base, b_ids)
    expected = None
    for i in range(start, max(len(a_ids), len(b_ids))):
        if i >= len(a_ids) or i >= len(b_ids) or a_ids[i] != b_ids[i]:
            expected = i
            break
    assert first_difference(a, b, start) == expected


def test_tail_cuts_every_per_token_part_and_shifts_spikes():
    t = make_trace(40, seed=3, annotate=True)
    cut = tail(t, 15)
    assert cut.tokens == t.tokens[15:] and len(cut) == 25
    np.testing.assert_array_equal(cut.token_ids, t.token_ids[15:])
    np.testing.assert_allclose(cut.metrics["cross_entropy"], t.metrics["cross_entropy"][15:])
    np.testing.assert_array_equal(cut.topk["reason"][0], t.topk["reason"][0][15:])
    assert cut.annotations["tags"] == t.annotations["tags"][15:]
    assert cut.annotations["spikes"]["positions"] == [p - 15 for p in t.annotations["spikes"]["positions"] if p >= 15]


def test_takeover_choices_offer_the_reasoner_then_each_distinct_topk_token():
    t = make_trace(10, seed=4, k=5)
    choices = takeover_choices(t, 6, fake_decode)
    assert choices[0].token is None and "reasoning model takes over" in choices[0].label
    tokens = [c.token for c in choices[1:]]
    expected = set(t.topk["reason"][0][6].tolist()) | set(t.topk["base"][0][6].tolist())
    assert len(tokens) == len(set(tokens)) and set(tokens) == expected
    assert choices[1].token == int(t.topk["reason"][0][6][0])  # the reasoner's favourite comes first
    with pytest.raises(InvalidInputError, match="outside the trace"):
        takeover_choices(t, 10)


def test_tree_rows_flatten_depth_first():
    tree = {"key": "r", "branch_pos": None, "n_tokens": 9, "children": [
        {"key": "a", "branch_pos": 2, "n_tokens": 7, "children": [{"key": "a1", "branch_pos": 5, "n_tokens": 8, "children": []}]},
        {"key": "b", "branch_pos": 4, "n_tokens": 6, "children": []}]}
    rows = tree_rows(tree)
    assert [(d, n["key"]) for d, n in rows] == [(0, "r"), (1, "a"), (2, "a1"), (1, "b")]
    assert tree_label(*rows[2]).strip().startswith("└ branch @ 5")


# -- spikes, hover data, the token view payload -------------------------------------------------


def test_annotate_view_top_rule_and_layers():
    t = make_trace(60, seed=5)
    v = annotate_view(t, "jsd", SpikeRule(top=0.1))
    pos = v.annotations["spikes"]["positions"]
    assert len(pos) == top_count(0.1, 60) == spike_count(60, SpikeRule(top=0.1))
    jsd = t.metrics["jsd"]
    assert min(jsd[pos]) >= max(np.delete(jsd, pos))  # the chosen ones are the largest
    assert len(v.annotations["tags"]) == 60 and set(v.annotations["segments"]) <= {"think", "answer"}


def test_annotate_view_gate_rule_uses_the_gate():
    t = make_trace(60, seed=6)
    gate = Gate(tau=float(np.quantile(t.metrics["cross_entropy"], 0.8)), lam=1.0, window=4)
    v = annotate_view(t, "cross_entropy", SpikeRule(top=None, gate=gate))
    assert v.annotations["spikes"]["rule"]["gate"] == gate.to_dict()
    assert spike_count(60, SpikeRule(top=None, gate=gate)) is None


def test_hover_data_is_strict_json_and_complete():
    t = make_trace(30, seed=7, k=5)
    t.metrics["logp_reason"][3] = np.nan  # JSON has no NaN: it must come out as null
    h = hover_data(t, "cross_entropy", fake_decode)
    text = json.dumps(h, allow_nan=False)
    assert json.loads(text)["metrics"]["logp_reason"][3] is None
    ids = set(np.concatenate([t.topk["base"][0].ravel(), t.topk["reason"][0].ravel(), t.token_ids]).tolist())
    assert {int(i) for i in h["vocab"]} == ids and h["vocab"][str(ids.pop())] is not None
    assert h["top"]["reason"] == t.topk["reason"][0].tolist()
    np.testing.assert_allclose(h["prob"]["base"], t.topk["base"][1], atol=6e-4)
    np.testing.assert_allclose(h["score"], t.metrics["cross_entropy"], atol=6e-4)


def test_build_view_one_span_per_token_escaped():
    text = ' <script> alert(1) & <b> "q" the\n\n x'
    t = annotate_view(make_trace(text=text, seed=8), "cross_entropy", SpikeRule(top=0.2))
    view = build_view(t, "cross_entropy", "linear", fake_decode)
    positions = [int(p) for p in re.findall(r'data-pos="(\d+)"', view["html"])]
    assert positions == list(range(len(t)))
    assert "<script>" not in view["html"] and "<b>" not in view["html"]
    assert "&lt;script&gt;" in view["html"] and "&amp;" in view["html"]
    assert view["spikes"] == t.annotations["spikes"]["positions"]
    assert view["hover"]["tokens"] == t.tokens  # raw: the browser sets it as text, never as HTML
    json.dumps({k: v for k, v in view.items()}, allow_nan=False)


def test_build_view_version_changes_with_the_colouring():
    t = annotate_view(make_trace(40, seed=9), "cross_entropy", SpikeRule())
    a = build_view(t, "cross_entropy", "linear")["version"]
    assert a == build_view(t, "cross_entropy", "linear")["version"]
    assert a != build_view(t, "cross_entropy", "rank")["version"]
    assert a != build_view(t, "jsd", "linear")["version"]


# -- the Problems table --------------------------------------------------------------------------


@pytest.fixture()
def filled_store(tmp_path):
    store = TraceStore(tmp_path / "store")
    for seed in range(6):
        meta = {"policy": {"name": "guided" if seed % 2 else "base_only", "params": {}},
                "problem": {"id": f"p{seed}", "prompt": f"Question number {seed}", "gold": "4"},
                "correct": None if seed == 5 else bool(seed % 3)}
        store.put(make_trace(20 + seed, seed=seed, meta=meta))
    return store


def test_trace_table_reports_the_chosen_score(filled_store):
    df = trace_table(filled_store.summaries(), "jsd", SpikeRule(top=0.1))
    assert len(df) == 6 and list(df.columns)[:4] == ["problem", "prompt", "pair", "policy"]
    for _, row in df.iterrows():
        t = filled_store.get(row["key"])
        assert row["max"] == pytest.approx(float(np.max(t.metrics["jsd"])))
        assert row["n_tokens"] == len(t) and row["spikes"] == top_count(0.1, len(t))
    with pytest.raises(InvalidInputError, match="Unknown score"):
        trace_table(filled_store.summaries(), "kll")


def test_filter_table(filled_store):
    df = trace_table(filled_store.summaries())
    assert set(filter_table(df, text="NUMBER 3")["problem"]) == {"p3"}
    assert set(filter_table(df, policies=["guided"])["problem"]) == {"p1", "p3", "p5"}
    assert set(filter_table(df, correct="yes")["problem"]) == {"p1", "p2", "p4"}
    assert set(filter_table(df, correct="no")["problem"]) == {"p0", "p3"}
    assert set(filter_table(df, correct="ungraded")["problem"]) == {"p5"}
    with pytest.raises(InvalidInputError, match="ungraded"):
        filter_table(df, correct="maybe")
    assert trace_table(pd.DataFrame(columns=df.columns)).empty
