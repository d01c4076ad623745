"""core/analysis/search.py: matches across traces against a brute-force reference, spikes, outcomes, errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.analysis.search import (
    compile_pattern,
    search_store,
    search_traces,
    spiking_keys,
)
from core.annotate.spikes import spikes_or_top
from core.errors import InvalidInputError
from core.io.store import TraceStore
from core.scoring.registry import score_values
from tests.fakes import make_trace

TEXT_A = "First we add. Wait, let me check: 2 + 2 = 4. Wait again."
TEXT_B = "So the answer is 4. No waiting here."


def _brute(trace, pattern: str, regex: bool) -> list[tuple[int, int, str]]:
    """(pos, end, text) of each match by walking characters token by token (no searchsorted)."""
    text = "".join(trace.tokens)
    owner = [i for i, t in enumerate(trace.tokens) for _ in t]  # character -> token
    out = []
    for m in re.finditer(pattern if regex else re.escape(pattern), text):
        if m.end() > m.start():
            out.append((owner[m.start()], owner[m.end() - 1], m.group(0)))
    return out


def test_literal_matches_positions_scores_spikes_and_outcome():
    a, b = make_trace(text=TEXT_A, seed=2), make_trace(text=TEXT_B, seed=3)
    found = search_traces([a, b], " Wait")
    assert list(found["key"]) == [a.key, a.key]
    assert [(r.pos, r.end, r.match) for r in found.itertuples()] == _brute(a, " Wait", False)
    assert all(a.tokens[p].startswith(" Wait") for p in found["pos"])
    ce = np.asarray(score_values(a.metrics, "cross_entropy"))
    assert found["score"].tolist() == pytest.approx([float(ce[p]) for p in found["pos"]])
    spiked = set(spikes_or_top(a, "cross_entropy").tolist())
    assert found["spike"].tolist() == [p in spiked for p in found["pos"]]
    assert set(found["correct"]) == {a.meta["correct"]} and set(found["problem"]) == {"p2"}
    assert search_traces([a, b], "wait", case=False)["key"].tolist() == [a.key, a.key, b.key]


def test_a_match_across_tokens_takes_the_highest_score_and_any_spike():
    a = make_trace(text=TEXT_A, seed=4)
    found = search_traces([a], r"2 \+ 2 = 4", regex=True)
    (row,) = found.itertuples()
    ce = np.asarray(score_values(a.metrics, "cross_entropy"))
    assert row.end > row.pos and row.score == pytest.approx(float(ce[row.pos : row.end + 1].max()))
    spiked = set(spikes_or_top(a, "cross_entropy").tolist())
    assert row.spike == any(p in spiked for p in range(row.pos, row.end + 1))


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet="ab .W", min_size=1, max_size=3), st.booleans())
def test_every_match_is_found_where_brute_force_finds_it(pattern, regex):
    trace = make_trace(text="a b. Wa ab  W.a bb a.W", seed=1)
    if regex:
        pattern = pattern.replace(".", "\\.") + "+"
    found = search_traces([trace], pattern, regex=regex)
    assert [(r.pos, r.end, r.match) for r in found.itertuples()] == _brute(trace, pattern, regex)


def test_spikes_only_limit_spiking_keys_and_store():
    traces = [make_trace(text=TEXT_A, seed=s, annotate=True) for s in range(4)]
    every = search_traces(traces, " Wait")
    only = search_traces(traces, " Wait", spikes_only=True)
    assert len(only) == int(every["spike"].sum()) and only["spike"].all()
    assert spiking_keys(every) == list(dict.fromkeys(only["key"]))
    assert len(search_traces(traces, " Wait", limit=3)) == 3


def test_search_store_reads_every_trace(tmp_path):
    store = TraceStore(tmp_path / "s")
    for s in range(3):
        store.put(make_trace(text=TEXT_A if s else TEXT_B, seed=s))
    found = search_store(store, "Wait")
    assert found["key"].nunique() == 2 and len(found) == 4


@pytest.mark.parametrize("bad, regex, words", [("", False, "non-empty"), ("(", True, "not a valid regular"),
                                               ("x" * 501, False, "at most")])
def test_bad_patterns_are_named(bad, regex, words):
    with pytest.raises(InvalidInputError, match=words):
        compile_pattern(bad, regex=regex)
