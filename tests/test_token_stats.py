"""core.instruments.token_stats: per-token (and per-tag) statistics equal a brute-force count over the traces."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import core
from core.annotate.spikes import spikes_or_top
from core.errors import InvalidInputError
from core.instruments.token_stats import TOKEN_STATS_COLUMNS, occurrences, token_stats
from core.scoring.registry import score_values
from tests.fakes import make_trace


def _brute(traces, by: str, score: str, effects: dict[tuple[str, int], float]) -> dict[str, dict]:
    """Loop over every token of every trace, in plain Python."""
    acc: dict[str, dict] = defaultdict(lambda: {"count": 0, "traces": set(), "scores": [], "spikes": 0,
                                                "takeovers": 0, "effects": []})
    for i, t in enumerate(traces):
        values = score_values(t.metrics, score)
        spikes = {int(p) for p in spikes_or_top(t, score)}
        labels = t.tokens if by == "token" else list(t.annotations["tags"])
        for pos, label in enumerate(labels):
            a = acc[label]
            a["count"] += 1
            a["traces"].add(i)
            a["scores"].append(float(values[pos]))
            a["spikes"] += pos in spikes
            a["takeovers"] += t.source[pos] == "reason"  # a forced token is the user's, not a takeover
            if (t.key, pos) in effects:
                a["effects"].append(effects[(t.key, pos)])
    return acc


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=5, unique=True), st.sampled_from(["token", "tag"]),
       st.sampled_from(["cross_entropy", "delta_logp", "jsd"]), st.integers(0, 10_000))
@settings(max_examples=40, deadline=None)
def test_stats_equal_a_brute_force_count(seeds: list[int], by: str, score: str, effect_seed: int) -> None:
    traces = [make_trace(n_tokens=20 + s % 30, seed=s, annotate=True, reason_share=0.2) for s in seeds]
    rng = np.random.default_rng(effect_seed)
    measured = {(t.key, int(p)): float(rng.uniform(-1, 1)) for t in traces for p in rng.choice(len(t), 3, replace=False)}
    effects = pd.DataFrame([{"trace": k, "pos": p, "effect": e} for (k, p), e in measured.items()])
    frame = token_stats(traces, score=score, by=by, effects=effects)
    assert list(frame.columns) == [by, *TOKEN_STATS_COLUMNS]
    ref = _brute(traces, by, score, measured)
    assert set(frame[by]) == set(ref) and frame["count"].sum() == sum(len(t) for t in traces)
    for row in frame.itertuples(index=False):
        r = ref[getattr(row, by)]
        assert row.count == r["count"] and row.traces == len(r["traces"])
        assert row.mean_score == pytest.approx(np.mean(r["scores"]), rel=1e-9, abs=1e-12)
        assert row.max_score == pytest.approx(max(r["scores"]))
        assert row.spike_rate == pytest.approx(r["spikes"] / r["count"])
        assert row.takeover_rate == pytest.approx(r["takeovers"] / r["count"])
        assert row.n_effects == len(r["effects"])
        if r["effects"]:
            assert row.mean_effect == pytest.approx(np.mean(r["effects"]))
        else:
            assert math.isnan(row.mean_effect)
    counts = frame["count"].to_numpy()
    assert (counts[:-1] >= counts[1:]).all()  # most frequent first


def test_occurrences_list_every_position_of_a_row() -> None:
    traces = [make_trace(n_tokens=40, seed=s, annotate=True) for s in range(3)]
    frame = token_stats(traces)
    word = frame.iloc[0]["token"]
    occ = occurrences(traces, word)
    assert len(occ) == frame.iloc[0]["count"]
    for row in occ.itertuples():
        assert traces[row.index].tokens[row.pos] == word and row.trace == traces[row.index].key


def test_tags_come_from_the_tagger_when_a_trace_has_none() -> None:
    traces = [make_trace(text="First, let me check the answer. Wait, 2 + 2 = 4.", seed=1)]
    assert "tags" not in traces[0].annotations
    frame = token_stats(traces, by="tag")
    assert frame["count"].sum() == len(traces[0])
    assert set(frame["tag"]) == set(core.tag_planning(traces[0]))


def test_bad_input_is_refused() -> None:
    traces = [make_trace(n_tokens=10)]
    with pytest.raises(InvalidInputError, match="by='word'.*token, tag"):
        token_stats(traces, by="word")
    with pytest.raises(InvalidInputError, match="kll"):
        token_stats(traces, score="kll")
    with pytest.raises(InvalidInputError, match="missing: effect"):
        token_stats(traces, effects=pd.DataFrame({"trace": ["x"], "pos": [1]}))
    assert token_stats([]).empty


def test_cli_tokens_prints_and_writes_the_table(tmp_path) -> None:
    from click.testing import CliRunner

    from core.cli import main

    store = core.TraceStore(tmp_path / "store")
    traces = [make_trace(n_tokens=30, seed=s, annotate=True) for s in range(3)]
    for t in traces:
        store.put(t)
    out = tmp_path / "tokens.csv"
    result = CliRunner().invoke(main, ["tokens", "--store", str(store.path), "--out", str(out), "--sort", "max_score"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out, keep_default_na=False, na_values=[""])
    assert table["count"].sum() == 90 and table["max_score"].is_monotonic_decreasing
    assert "tokens over 3 traces" in result.output
    want = token_stats(traces).sort_values("max_score", ascending=False, kind="stable", na_position="last")["token"]
    shown = result.output.splitlines()[1:-1]  # the rows under the header: each starts with its quoted token
    assert len(shown) == 15 and all(line.strip().startswith(repr(t)) for line, t in zip(shown, want)), shown
    assert any(t.startswith(" ") for t in want[:15])  # ' x' shown apart from 'x'


@pytest.mark.parametrize("text, says", [
    ('garbage,\n"x\n', "cannot read an effects table"),  # malformed CSV (pandas' ParserError)
    ("", "cannot read an effects table"),  # empty file (EmptyDataError)
    ("trace,pos\nab,1\n", "missing: effect"),
    ("trace,pos,effect\nab,1,high\n", "an effect that is not a number in 1 row(s) (first: 'high' in data row 1)"),
    ("trace,pos,effect\nab,1,0.5\nab,x,0.5\n", "a pos that is not a whole number in 1 row(s) (first: 'x' in data row 2)"),
])
def test_cli_tokens_refuses_a_bad_effects_file(tmp_path, text, says) -> None:
    from click.testing import CliRunner

    from core.cli import main

    store = core.TraceStore(tmp_path / "store")
    store.put(make_trace(n_tokens=10, annotate=True))
    bad = tmp_path / "effects.csv"
    bad.write_text(text)
    result = CliRunner().invoke(main, ["tokens", "--store", str(store.path), "--effects", str(bad)])
    assert result.exit_code == 2  # a usage error, not a traceback
    assert "--effects" in result.output and says in result.output, result.output
    assert "Traceback" not in result.output


def test_read_effects_reads_what_effects_writes(tmp_path) -> None:
    from core.instruments.effects import EFFECT_COLUMNS
    from core.instruments.token_stats import read_effects

    path = tmp_path / "effects.csv"
    pd.DataFrame([["0123", 4, *[""] * 4, 0.5, 0.25, 0.25, *[0] * 10]], columns=EFFECT_COLUMNS).to_csv(path, index=False)
    table = read_effects(path)
    assert (table["trace"].tolist(), table["pos"].tolist(), table["effect"].tolist()) == (["0123"], [4], [0.25])
