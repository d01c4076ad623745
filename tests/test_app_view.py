"""The app's plain helpers (app/view.py, app/config.py, the token view payload): no browser, no models."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fakes import fake_decode, make_trace
from hypothesis import given, settings
from hypothesis import strategies as st

from core.views.token_payload import view_payload as build_view
from app.config import parse_args, script_args
from app.view import (
    SpikeRule,
    annotate_view,
    filter_table,
    md_code,
    spike_count,
    trace_table,
)
from core.annotate.spikes import Gate, top_count
from core.errors import InvalidInputError
from core.io.store import TraceStore
from core.views.presentation import (
    first_difference,
    hover_data,
    tail,
    takeover_choices,
    tree_label,
    tree_rows,
)

# -- config --------------------------------------------------------------------------------------


def test_app_arguments_follow_the_app_script_only():
    """`streamlit run app/main.py -- X` and `app/serve.py -- X` give the app X; another ASGI server's command line
    (`uvicorn app.serve:streamlit_app --port 1`) is its own, not the app's."""
    app_dir = Path(__file__).resolve().parents[1] / "app"
    assert script_args([str(app_dir / "main.py"), "--store", "s"]) == ["--store", "s"]
    assert script_args([str(app_dir / "serve.py"), "--base", "b", "--reason", "r"]) == ["--base", "b", "--reason", "r"]
    assert script_args(["/venv/bin/uvicorn", "app.serve:streamlit_app", "--port", "1"]) == []
    assert script_args([]) == []


def test_parse_args_defaults_to_demo_pair():
    cfg = parse_args([])
    assert cfg.pair.demo and cfg.store is None and cfg.problems is None and cfg.max_new_tokens is None  # what the pair allows (resources.max_new_tokens)


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
    out = trace.prefix(len(ids))
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
    # the positions are exactly where the gate rule fires, checked step by step in plain Python
    s = [float(x) for x in t.metrics["cross_entropy"]]
    expected = []
    for i, cur in enumerate(s):
        history = s[max(0, i - gate.window):i]
        mean = sum(history) / len(history) if history else 0.0
        if cur > gate.tau and cur > gate.lam * mean:
            expected.append(i)
    assert 0 < len(expected) < 60
    assert [int(p) for p in v.annotations["spikes"]["positions"]] == expected


def test_hover_data_is_strict_json_and_complete():
    t = make_trace(30, seed=7, k=5)
    t.metrics["logp_reason"][3] = np.nan  # JSON has no NaN: it must come out as null
    h = hover_data(t, "cross_entropy", fake_decode)
    text = json.dumps(h, allow_nan=False)
    assert json.loads(text)["metrics"]["logp_reason"][3] is None
    ids = set(np.concatenate([t.topk["base"][0].ravel(), t.topk["reason"][0].ravel(), t.token_ids]).tolist())
    assert {int(i) for i in h["vocab"]} == ids and h["vocab"][str(ids.pop())] is not None
    assert h["top"]["reason"] == t.topk["reason"][0].tolist()
    np.testing.assert_allclose(h["prob"]["base"], t.topk["base"][1], rtol=6e-6)  # 6 significant digits
    np.testing.assert_allclose(h["score"], t.metrics["cross_entropy"], rtol=6e-4)  # 4: tiny values stay tiny


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
        assert row["n_tokens"] == len(t) and row["max spikes"] == top_count(0.1, len(t))
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


# -- issue 11: probabilities, escaping, diffs, branch labels ------------------------------------------


def test_fmt_prob_never_reads_zero_for_a_small_probability():
    from core.views.presentation import fmt_prob

    assert fmt_prob(0.0131) == "0.0131" and fmt_prob(0.000123) == "1.23e-04" and fmt_prob(0.0) == "0"
    assert fmt_prob(0.5, "logprob") == f"{np.log(0.5):.3f}" and fmt_prob(0.0, "logprob") == "−inf"
    assert fmt_prob(None) == "–" and fmt_prob(float("nan")) == "–"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_md_escape_leaves_no_markdown_structure(text):
    from app.view import md_escape

    out = md_escape(text)
    for ch in "[]()!`*_<>:#|~":  # every such mark arrives escaped: a link, image or directive cannot form
        assert all(out[i - 1] == "\\" for i, c in enumerate(out) if c == ch), (text, out)


def test_takeover_choices_show_both_models_probabilities():
    from core.views.presentation import prob_at

    trace = make_trace(12, seed=4)
    choices = takeover_choices(trace, 3, fake_decode)
    for choice in choices[1:]:
        assert "base " in choice.label and "reason " in choice.label
        for side in ("base", "reason"):
            p = prob_at(trace, side, 3, choice.token)
            if p is not None:
                from core.views.presentation import fmt_prob

                assert f"{side} p={fmt_prob(p)}" in choice.label
            else:
                assert f"{side} p<" in choice.label


def test_token_diff_aligns_equal_tokens_and_reports_deltas():
    from core.views.presentation import token_diff

    a = make_trace(10, seed=1)
    b = _with_ids(make_trace(11, seed=2), [*a.token_ids[:4].tolist(), 999, *a.token_ids[4:10].tolist()])
    b.tokens[4] = "X"
    df = token_diff(a, b, 2)
    assert list(df["op"]).count("insert") == 1 and (df["op"] == "equal").sum() == 8
    ins = df[df["op"] == "insert"].iloc[0]
    assert ins["pos_branch"] == 4 and pd.isna(ins["pos_original"]) and np.isnan(ins["delta"])
    eq = df[df["op"] == "equal"].iloc[-1]
    assert eq["pos_original"] == 9 and eq["pos_branch"] == 10
    assert eq["delta"] == pytest.approx(float(b.metrics["cross_entropy"][10]) - float(a.metrics["cross_entropy"][9]))


def test_branch_label_names_the_forced_token():
    from core.views.presentation import branch_token_text

    trace = make_trace(8, seed=3)
    trace.meta["branch_pos"] = 2
    trace.source[2] = "forced"
    node = {"key": "k" * 32, "branch_pos": 2, "n_tokens": 8}
    label = tree_label(1, node, branch_token_text(trace, fake_decode))
    assert f"branch @ 2 forced {fake_decode(int(trace.token_ids[2]))!r}" in label
    trace.source[2] = "reason"
    assert branch_token_text(trace).startswith("reasoner ")


def test_hover_labels_come_from_the_metric_registry():
    from core.scoring.registry import METRICS

    data = hover_data(make_trace(6, seed=2), "jsd", fake_decode)
    assert data["labels"] == {name: METRICS[name].label for name in data["metrics"]}
    assert data["score_name"] == METRICS["jsd"].label


def test_long_trace_pages_keep_absolute_positions_and_the_whole_range():
    from core.views.presentation import PAGE_TOKENS, page_bounds

    n = PAGE_TOKENS + 300
    trace = annotate_view(make_trace(n, seed=9), "cross_entropy", SpikeRule(top=0.05))
    assert page_bounds(n, 0) == (0, PAGE_TOKENS) and page_bounds(n, 1) == (PAGE_TOKENS, n) and page_bounds(n, 9) == (PAGE_TOKENS, n)
    whole = build_view(trace, "cross_entropy")
    page = build_view(trace, "cross_entropy", start=PAGE_TOKENS, end=n)
    positions = [int(p) for p in re.findall(r'data-pos="(\d+)"', page["html"])]
    assert positions == list(range(PAGE_TOKENS, n)) and page["offset"] == PAGE_TOKENS
    assert page["spikes"] == whole["spikes"] and (page["vmin"], page["vmax"]) == (whole["vmin"], whole["vmax"])
    assert len(page["hover"]["tokens"]) == 300 and page["hover"]["offset"] == PAGE_TOKENS
    colour = dict(re.findall(r'data-pos="(\d+)" style="background:(#[0-9a-f]{6})', whole["html"]))
    assert all(colour[p] == c for p, c in re.findall(r'data-pos="(\d+)" style="background:(#[0-9a-f]{6})', page["html"]))


def test_dataset_selection_keeps_scored_and_imported_traces():
    from app.view import select_rows, with_policy_labels

    df = pd.DataFrame({"key": ["a", "b", "c", "d"], "pair": ["p"] * 4, "n_tokens": [5, 6, 7, 0],
                       "policy": ["base_only", None, None, "guided"], "kind": ["generate", "score", "import", "generate"]})
    labelled = with_policy_labels(df)
    assert list(labelled["policy"]) == ["base_only", "(score)", "(import)", "guided"]
    policies = sorted(labelled["policy"].dropna().unique())  # what the Policy filter offers (and selects)
    rows = select_rows(labelled, ["p"], policies, ["generate", "score", "import"])
    assert list(rows["key"]) == ["a", "b", "c"]  # the empty trace d is left out, scored/imported stay


def test_the_app_builds_policies_only_through_the_registry():
    """No policy class is constructed and no takeover is counted by hand anywhere in app/ (issue 10)."""
    from pathlib import Path

    from core.decoding.policies import list_policies

    names = [spec.cls.__name__ for spec in list_policies(include_internal=True)]
    pattern = re.compile(r"\b(" + "|".join(names) + r")\s*\(|\.from_gate\(|!= \"base\"")
    root = Path(__file__).resolve().parents[1] / "app"
    hits = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py")
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not hits, hits


def test_score_plot_has_round_ticks_and_names_each_line_once():
    import math

    from app.figures import trace_figure
    from core.scoring.registry import METRICS

    trace = annotate_view(make_trace(40, seed=5), "cross_entropy", SpikeRule(top=0.1))
    fig = trace_figure(trace, "cross_entropy")
    for axis in (fig.layout.yaxis, fig.layout.yaxis2):
        mantissa = axis.dtick / 10 ** math.floor(math.log10(axis.dtick))
        assert round(mantissa, 6) in (1, 2, 2.5, 5) and abs(axis.tick0 / axis.dtick - round(axis.tick0 / axis.dtick)) < 1e-9
        assert axis.range[0] <= 0 < axis.range[1]
    assert [t.name for t in fig.data] == [METRICS["cross_entropy"].label, METRICS["entropy_base"].label, "spikes"]
    only = trace_figure(trace, "entropy_base")  # the score is the base entropy: one line, one legend entry
    assert [t.name for t in only.data].count(METRICS["entropy_base"].label) == 1 and "yaxis2" not in only.layout.to_plotly_json()


def test_forkpoint_app_forwards_every_pair_flag_to_the_app(monkeypatch):
    """`forkpoint app` takes the same pair flags as every other command and the app parses what it forwards."""
    import subprocess

    from click.testing import CliRunner

    from core.cli import main

    seen = {}

    class FakeChild:
        def __init__(self, cmd, env=None):
            seen["cmd"], seen["env"] = cmd, env

        def wait(self):
            return 0

        def send_signal(self, sig):
            pass

    monkeypatch.setattr(subprocess, "Popen", FakeChild)
    args = ["app", "--base", "b/x", "--reason", "r/y", "--base-revision", "v1", "--reason-revision", "v2",
            "--trust-remote-code", "--store", "st", "--base-format", "Q: {problem}\nA:", "--port", "8600"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    root = Path(__file__).resolve().parents[1]  # st.App with the live route and the plain-HTTP Host check
    assert seen["cmd"][1:5] == ["-m", "streamlit", "run", str(root / "app" / "serve.py")]
    assert str(Path(__file__).resolve().parents[1]) in seen["env"]["PYTHONPATH"].split(os.pathsep)
    forwarded = seen["cmd"][seen["cmd"].index("--") + 1:]
    config = parse_args(forwarded)
    assert (config.pair.base, config.pair.reason, config.pair.base_revision, config.pair.reason_revision) == (
        "b/x", "r/y", "v1", "v2")
    assert config.pair.trust_remote_code is True and config.store == "st"
    assert config.pair.base_format == "Q: {problem}\nA:"
    assert parse_args([]).pair.trust_remote_code is False


def test_policy_text_names_branches_imports_and_policies():
    """Issue 22 defect 10: "None" in Problems, "import" on the Trace page, a reasoner takeover called base_only."""
    from core.views.presentation import policy_text

    assert policy_text("guided", "generate") == "guided"
    assert policy_text(None, "import") == policy_text("None", "import") == policy_text(float("nan"), "import") == "import"
    assert policy_text("base_only", "branch", "abc") == "branch · then base_only"
    assert policy_text(None, None) == "?"


def test_md_code_shows_a_space_token():
    from app.view import md_code

    assert md_code(" ") == "`' '`" and md_code("\n") == "`'\\n'`" and md_code("") == "`(empty)`"


def test_a_typed_branch_is_named_by_all_its_forced_tokens():
    from core.trace import Trace
    from core.views.presentation import branch_token_text

    trace = make_trace(text="a b c d e f g", seed=1, reason_share=0.0)
    source = np.array(["base"] * len(trace), dtype=object)
    source[2:5] = "forced"
    typed = Trace(token_ids=trace.token_ids, tokens=trace.tokens, prompt_ids=trace.prompt_ids, metrics=trace.metrics,
                  topk=trace.topk, source=source, meta={**trace.meta, "branch_pos": 2, "parent": "x"})
    assert branch_token_text(typed) == "forced ' c d e' (3 tokens)"


def test_typed_text_split_over_byte_level_tokens_is_named_whole():
    """Typed '🙂!' is three byte-level tokens; decoded one by one the first two are replacement characters, so an
    edge label read "✎ #2 '��!'": the run is named by its display strings ('' then '🙂' then '!')."""
    import dataclasses

    from core.views.presentation import switch_text

    trace = make_trace(text="a b c d e f", seed=1, reason_share=0.0)
    tokens = list(trace.tokens)
    tokens[2:5] = ["", "🙂", "!"]
    # a record made before meta["typed"]: its switches in force (a run of forced ids) say it was typed
    typed = dataclasses.replace(trace, tokens=tokens, meta={**trace.meta, "parent": "x", "switched": [
        {"pos": p, "to": "forced"} for p in (2, 3, 4)], "switches": {str(p): int(trace.token_ids[p]) for p in (2, 3, 4)}})
    assert switch_text(typed, lambda i: "\ufffd") == "✎ #2 '🙂!'"
    assert switch_text(typed, lambda i: "X") == "✎ #2 '🙂!'"


def test_the_default_length_is_what_the_pair_allows(qwen_pair, monkeypatch):
    """Issue 22.11: without --max-new-tokens the app asks for settings.MAX_NEW_TOKENS capped to half the pair's
    context (the demo pair's 192 tokens: 96; the whole context still warned, as the prompt needs room too)."""
    import streamlit as st

    from app import resources
    from app.config import AppConfig, PairChoice
    from core import settings

    for side in ("base", "reason"):
        monkeypatch.setattr(qwen_pair.model(side).config, "max_position_embeddings", 100 if side == "base" else 150)
    monkeypatch.setitem(st.session_state, "config", AppConfig(pair=PairChoice()))
    assert resources.max_new_tokens(qwen_pair) == 50 < settings.MAX_NEW_TOKENS  # half the shorter context
    assert resources.max_new_tokens(None) == settings.MAX_NEW_TOKENS
    monkeypatch.setitem(st.session_state, "config", AppConfig(pair=PairChoice(), max_new_tokens=32))
    assert resources.max_new_tokens(qwen_pair) == 32


@pytest.mark.parametrize("score", ["cross_entropy", "entropy_base", "delta_logp"])
def test_figures_built_unvalidated_are_what_plotlys_validation_makes_of_their_specs(score):
    """app/figures.py skips plotly's validation (50-150 ms a figure, on every switch): each spec, validated in full
    with the template by name, gives the same figure JSON, so no property is misspelt, mistyped or dropped."""
    import plotly.graph_objects as go
    from test_branch_graph import random_tree

    from app.figures import branch_graph_figure, branch_graph_spec, trace_figure, trace_spec
    from core.views.branch_graph import graph_layout

    def validated(spec):
        return go.Figure({"data": spec["data"], "layout": {**spec["layout"], "template": "plotly_white"}})

    trace = annotate_view(make_trace(40, seed=5), score, SpikeRule(top=0.1))
    assert trace.spike_positions  # the spike markers' trace is checked too
    assert json.loads(trace_figure(trace, score).to_json()) == json.loads(validated(trace_spec(trace, score)).to_json())
    nodes = graph_layout(random_tree(12, 3), "k5", fold=False)
    labels = {n.key: f"⇄ #{i} ' x'" for i, n in enumerate(nodes)}
    fast = branch_graph_figure(nodes, labels, "k5")
    assert json.loads(fast.to_json()) == json.loads(validated(branch_graph_spec(nodes, labels, "k5")).to_json())
    assert {d.name for d in fast.data} >= {"correct", "wrong"} and fast.layout.template.layout.paper_bgcolor == "white"


def _child(text: str, key: str, temperature: float, parent: str = "p", sample: int | None = None) -> "Trace":
    """A fake child of `parent`: switch {2: reason} recorded, `text` its response; a fan's `sample` index."""
    import dataclasses

    trace = make_trace(text=text, seed=1)
    meta = {**trace.meta, "key": key, "parent": parent, "branch_pos": 2, "switches": {"2": "reason"}, "typed": {},
            "sampling": {"temperature": temperature, "seed": 7 + (sample or 0)},
            "switched": [{"pos": 2, "to": "reason", "from": "base"}]}
    return dataclasses.replace(trace, meta=meta | ({} if sample is None else {"fan": {"sample": sample}}))


def test_siblings_that_read_alike_are_told_apart_in_the_graph():
    """Audit 31 D1b: a fan's samples and the greedy flip all read "⇄ #2 reasoner ' c'" on their edges (on the
    demo pair the samples' texts were the greedy one's too). Each gets the token where it parts from its nearest
    such sibling, or which one it repeats, and which draw it is; the graph's short label keeps those in view."""
    from core.views.presentation import short_label, sibling_labels, switch_text

    greedy = _child("a b c d e f", "g", 0.0)
    one = _child("a b c d x y", "s1", 0.8, sample=0)
    two = _child("a b c d x z", "s2", 0.8, sample=1)
    three = _child("a b c d e f", "s3", 0.8, sample=2)  # the greedy text again
    old = _child("a b c d x z", "s4", 0.8)  # a sample stored before fans named their draws: its seed
    other = _child("a b c q", "o", 0.0, parent="elsewhere")  # the same switch under another parent: alone
    kids = [greedy, one, two, three, old, other]
    labels = {t.key: switch_text(t) for t in kids}
    assert set(labels.values()) == {"⇄ #2 reasoner ' c'"}
    told = sibling_labels(labels, kids)
    assert told == {"g": "⇄ #2 reasoner ' c' · same text as sample 3 · greedy",
                    "s1": "⇄ #2 reasoner ' c' · #5 ' y' · sample 1",
                    "s2": "⇄ #2 reasoner ' c' · same text as seed 7 · sample 2",
                    "s3": "⇄ #2 reasoner ' c' · same text as greedy · sample 3",
                    "s4": "⇄ #2 reasoner ' c' · same text as sample 2 · seed 7",
                    "o": "⇄ #2 reasoner ' c'"}
    shown = {k: short_label(v) for k, v in told.items()}
    assert shown["s1"] == "⇄ #2 r… · #5 ' y' · sample 1" and shown["s3"] == "⇄ #2 reasoner '… · sample 3"
    assert len(set(shown.values())) == len(shown), shown  # every edge shows its own label
    assert all(len(v) <= 30 for v in shown.values()), shown
    assert short_label("⇄ #2 reasoner ' c'") == "⇄ #2 reasoner ' c'"  # short enough: as it is
    assert short_label("x" * 40) == "x" * 27 + "…"


def test_outcome_and_who_wrote_read_naturally():
    """Audit 31 wording: "1 takeovers" in the outcome line; "emitted by forced" in the selection panel."""
    import dataclasses

    from core.views.presentation import outcome_line, who_wrote

    trace = make_trace(text="a b c d e f", seed=1, reason_share=0.0)
    source = np.array(["base"] * len(trace), dtype=object)
    source[1] = "reason"
    source[3:5] = "forced"
    one = dataclasses.replace(trace, source=source, meta={**trace.meta, "typed": {"3": 1}})
    assert " · 1 takeover · ρ = 0.167" in outcome_line(one)
    two = dataclasses.replace(one, source=np.array(["reason", "reason", *source[2:]], dtype=object))
    assert " · 2 takeovers · ρ = 0.333" in outcome_line(two)
    assert [who_wrote(one, p) for p in (0, 1, 3, 4)] == [
        "emitted by base", "emitted by reason (a takeover)", "typed by you", "forced by you"]


def test_a_graph_node_with_one_takeover_says_takeover():
    """Audit 31 wording: a node's hover read "1 takeovers"."""
    from app.figures import branch_graph_spec
    from core.views.branch_graph import GraphNode

    nodes = [GraphNode("r", 0, 0.0, None, None, 9, None, 0, 0), GraphNode("a", 1, 0.0, "r", 2, 9, True, 1, 0),
             GraphNode("b", 1, 1.0, "r", 3, 9, False, 2, 0)]
    tips = [t for d in branch_graph_spec(nodes, {"a": "⇄ #2 reasoner ' x'"}, "r")["data"] if d.get("customdata")
            for t in d["hovertext"]]
    assert sorted(t.split(" · ")[2] for t in tips) == ["0 takeovers", "1 takeover", "2 takeovers"], tips
