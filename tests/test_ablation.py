"""core.instruments.ablation: each takeover switched off in turn, the variants decoded in one batch.

The batch is checked against the switchboard's one-child-at-a-time call (`set_switches`, itself checked
against Hugging Face argmaxes in test_takeover): the same tokens, sources and store keys, greedy and
sampled, for any switch sets (late-joining rows, per-row forced tokens, inherited switches).
"""

from __future__ import annotations

import numpy as np
import pytest
import test_takeover
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_decoding import PROMPTS

import core
import core.decoding.takeover as tk
from core.decoding import CACHES
from core.decoding.engine import Decoder
from core.decoding.takeover import (
    flipped,
    set_switches,
    set_switches_many,
    switches_in_force,
)
from core.instruments.ablation import ablate_takeovers, ablation_switches

GUIDED = test_takeover.GUIDED
pair, guided = test_takeover.pair, test_takeover.guided  # the same tiny pair and Guided trace (fixtures)


def test_the_fixture_has_several_takeovers(guided) -> None:
    assert guided.n_takeovers >= 3, "the Guided fixture needs several takeovers to ablate"


@pytest.fixture(scope="module")
def sampled(pair) -> core.Trace:
    trace = core.generate(pair, PROMPTS[0], core.make_policy("guided", **GUIDED), max_new_tokens=20,
                          temperature=0.9, seed=3)
    assert trace.n_takeovers >= 2, "the fixture needs a sampled Guided trace with takeovers"
    return trace


@pytest.fixture(scope="module")
def switched(pair, guided) -> core.Trace:
    """A child with switches of its own (a takeover on, a typed token): its ablation keeps them."""
    b = next(i for i, s in enumerate(guided.source) if s == "base" and i > 2)
    return core.takeover(pair, guided, {b: "reason", b + 2: 7})


def _same(a: core.Trace, b: core.Trace) -> None:
    assert a.token_ids.tolist() == b.token_ids.tolist()
    assert [str(s) for s in a.source] == [str(s) for s in b.source]
    assert a.key == b.key and a.meta.get("switches") == b.meta.get("switches") and a.meta["parent"] == b.meta["parent"]
    # float32 rows decoded in a batch of several vs alone: the same sums in another order (~1e-6 relative)
    np.testing.assert_allclose(a.metrics["cross_entropy"], b.metrics["cross_entropy"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a.topk["base"][1], b.topk["base"][1], atol=1e-5)


def _one_by_one(pair, trace, wanted):
    CACHES.clear()  # each from a cold start too: the batch must not depend on what is held
    return [set_switches(pair, trace, w) for w in wanted]


@pytest.mark.parametrize("which", ["guided", "sampled", "switched"])
def test_the_batch_is_the_switchboard_one_child_at_a_time(pair, which, request) -> None:
    trace = request.getfixturevalue(which)
    wanted = [w for _, w in ablation_switches(trace)]
    assert len(wanted) == trace.n_takeovers >= 2
    batch = set_switches_many(pair, trace, wanted)
    for got, want in zip(batch, _one_by_one(pair, trace, wanted)):
        _same(got, want)


def test_each_variant_is_the_flipped_takeover(guided) -> None:
    """On a root, switching takeover p off is the switchboard's click on p (`flipped`)."""
    for pos, w in ablation_switches(guided):
        assert w == flipped(guided, pos) == {pos: "base"}


def test_ablation_keeps_a_childs_other_switches(switched) -> None:
    kept = switches_in_force(switched)
    variants = ablation_switches(switched)
    assert len(kept) == 2 and len(variants) == switched.n_takeovers
    for pos, w in variants:
        assert w == {**kept, pos: "base"}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.dictionaries(st.integers(0, 22), st.one_of(st.sampled_from(["reason", "base"]), st.integers(0, 60)),
                                min_size=1, max_size=3), min_size=1, max_size=4),
       st.sampled_from(["guided", "sampled", "switched"]))
def test_any_switch_sets_batch_as_they_decode_alone(pair, guided, sampled, switched, wanted, which) -> None:
    """Rows that join at different positions, force different tokens at one position, or inherit switches."""
    trace = {"guided": guided, "sampled": sampled, "switched": switched}[which]
    wanted = [{p: w for p, w in one.items() if p < len(trace)} or {0: "reason"} for one in wanted]
    for got, want in zip(set_switches_many(pair, trace, wanted), _one_by_one(pair, trace, wanted)):
        _same(got, want)


def test_ablate_takeovers_decodes_once_and_stores_what_the_switchboard_would(pair, guided, tmp_path,
                                                                          monkeypatch) -> None:
    store = core.TraceStore(tmp_path / "store")
    asked: list[int] = []
    decoded: list[int] = []
    real, run = tk.decode_children, Decoder.run

    def spy(pair_, trace_, children, *args, **kwargs):
        asked.append(len(children))
        return real(pair_, trace_, children, *args, **kwargs)

    def counted(self):
        decoded.append(len(self.rows))
        return run(self)

    monkeypatch.setattr(tk, "decode_children", spy)
    monkeypatch.setattr(Decoder, "run", counted)
    seen: list[tuple[int, int]] = []
    table = ablate_takeovers(pair, guided, store=store, progress=lambda d, n: seen.append((d, n)))
    positions = [i for i, s in enumerate(guided.source) if s != "base"]
    assert asked == [len(positions)] and len(decoded) <= 1, "all the variants in one batch"
    assert list(table["pos"]) == positions and seen[-1] == (len(positions), len(positions))
    assert all(d <= n for d, n in seen) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    for row in table.itertuples():
        alone = set_switches(pair, guided, flipped(guided, row.pos))
        assert row.key == alone.key and row.key in store
        kid = store.get(row.key)
        _same(kid, alone)
        if kid.key == guided.key:  # the base writes the reasoner's token there too: no change, the trace itself
            assert int(guided.topk["base"][0][row.pos, 0]) == int(guided.token_ids[row.pos])
        else:
            assert kid.source[row.pos] == "base"
        assert row.n_tokens == len(kid)
        assert row.same_answer == (kid.meta.get("answer") == guided.meta.get("answer"))
    decoded.clear()
    again = ablate_takeovers(pair, guided, store=store)
    assert decoded == [] and again.equals(table), "a rerun reads every child back"


def test_a_trace_without_takeovers_has_nothing_to_ablate(pair) -> None:
    plain = core.generate(pair, PROMPTS[0], max_new_tokens=8)
    table = ablate_takeovers(pair, plain)
    assert table.empty and list(table.columns) == ["pos", "token", "answer", "correct", "same_answer", "n_tokens",
                                                   "key"]
