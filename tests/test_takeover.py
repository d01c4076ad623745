"""core.takeover: switch takeovers on and off at any positions of a trace (the app's switchboard).

Checked against the parent itself (round trips are exact under greedy decoding and under the
position-keyed draws of sampling), against plain Hugging Face argmaxes (via `test_decoding`'s helpers),
and by counting backbone calls (a switch at p re-reads none of the prefix).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spies import FeedLog
from test_decoding import PROMPTS, assert_greedy

import core
import core.decoding.takeover as tk
from core.decoding import CACHES
from core.decoding.takeover import switches
from core.errors import InvalidInputError
from core.views.presentation import flip_changes

GUIDED = {"tau": 2.0, "lam": 1.0, "window": 4}  # fires a few times on the tiny pair's prompts


@pytest.fixture(scope="module")
def pair(qwen_pair) -> core.ModelPair:
    return qwen_pair


@pytest.fixture(scope="module")
def guided(pair) -> core.Trace:
    trace = core.generate(pair, PROMPTS[1], core.make_policy("guided", **GUIDED), max_new_tokens=24)
    assert trace.n_takeovers >= 2, "the fixture needs a Guided trace with takeovers"
    return trace


def _tokens(trace: core.Trace) -> tuple[list[int], list[str]]:
    return trace.token_ids.tolist(), [str(s) for s in trace.source]


def test_switching_a_takeover_off_and_on_gives_the_parent_back(pair, guided) -> None:
    changes = set(flip_changes(guided))
    for p in [i for i, s in enumerate(guided.source) if s == "reason" and i in changes]:
        off = core.takeover(pair, guided, {p: "base"})
        assert off.source[p] == "base" and off.token_ids[:p].tolist() == guided.token_ids[:p].tolist()
        assert off.meta["switched"] == [{"pos": p, "to": "base", "token": None, "from": "reason"}]
        assert off.meta["parent"] == guided.key and off.meta["root"] == guided.key
        back = core.takeover(pair, off, {p: "reason"})
        assert _tokens(back) == _tokens(guided)
        assert back.meta["switches"] == {str(p): "reason"}  # the off switch is replaced, not stacked


def _other(trace: core.Trace, p: int) -> str:
    return "base" if str(trace.source[p]) == "reason" else "reason"


def test_the_same_switches_from_any_ancestor_are_the_same_trace(pair, guided) -> None:
    """Switches that each change the text (a switch that changes none is not recorded: it gives the parent)."""
    p = next(i for i in flip_changes(guided) if i >= 3)
    one = core.takeover(pair, guided, {p: _other(guided, p)})
    q = next(i for i in flip_changes(one) if i > p + 1)
    both = core.takeover(pair, guided, {p: _other(guided, p), q: _other(one, q)})
    step = core.takeover(pair, one, {q: _other(one, q)})
    assert _tokens(both) == _tokens(step) and both.key == step.key
    assert step.meta["switches"] == {str(p): _other(guided, p), str(q): _other(one, q)}
    assert step.meta["root"] == guided.key


def test_a_switch_where_both_models_agree_is_the_parent_itself(self_pair, tmp_path, monkeypatch) -> None:
    """With the same model on both sides the two always agree: any switch keeps the text, so it gives the
    parent itself (same key), stores nothing, and under greedy decoding is decided without decoding."""
    parent = core.generate(self_pair, PROMPTS[1], max_new_tokens=16)
    assert flip_changes(parent) == []
    store = core.TraceStore(tmp_path / "store")
    monkeypatch.setattr("core.decoding.engine.Decoder.run", lambda *a, **k: pytest.fail("decoded a no-op switch"))
    for p in (0, 7, 15):
        child = core.takeover(self_pair, parent, {p: "reason"}, store=store)
        assert child is parent and child.key == parent.key
    assert len(store.keys()) == 0


@pytest.mark.parametrize("then", ["base", "reason", "policy"])
def test_then_decides_every_other_position(pair, guided, then: str) -> None:
    p = 2
    child = core.takeover(pair, guided, {p: "reason"}, then=then)
    after = [str(s) for s in child.source[p + 1:]]
    if then == "base":
        assert set(after) <= {"base"}
    elif then == "reason":
        assert set(after) == {"reason"}
    else:
        assert child.meta["policy"]["name"] == "guided"
    assert_greedy(pair, child)


def test_a_typed_string_is_forced_from_its_position(pair, guided) -> None:
    ids = pair.tokenizer.encode(" nine", add_special_tokens=False)[:3] + [7]
    child = core.takeover(pair, guided, {4: ids}, then="base")
    assert child.token_ids[4:4 + len(ids)].tolist() == ids
    assert set(child.source[4:4 + len(ids)]) == {"forced"}
    assert child.meta["switches"] == {str(4 + i): t for i, t in enumerate(ids)}


def test_sampled_switches_repeat_and_a_no_op_switch_is_the_parent(pair) -> None:
    parent = core.generate(pair, PROMPTS[0], core.make_policy("guided", **GUIDED), max_new_tokens=20,
                           temperature=0.9, seed=3)
    p = next(i for i, s in enumerate(parent.source) if s == "base")
    same = core.takeover(pair, parent, {p: "base"})  # the base draws the same token from the same keyed stream
    assert _tokens(same) == _tokens(parent)
    a = core.takeover(pair, parent, {p + 1: "reason"})
    CACHES.clear()
    b = core.takeover(pair, parent, {p + 1: "reason"})
    assert _tokens(a) == _tokens(b)


def test_a_switch_reads_none_of_the_prefix_again(pair, monkeypatch) -> None:
    CACHES.clear()
    parent = core.generate(pair, PROMPTS[1], core.make_policy("guided", **GUIDED), max_new_tokens=18)
    log = FeedLog(pair, monkeypatch)
    first_new: list[int] = []
    core.takeover(pair, parent, {10: "reason", 14: "base"}, lookahead=1,
                  on_token=lambda pos, tok, src: first_new.append(len(log.calls)))
    assert first_new[0] == 0, "a forward ran before the first new token"
    assert all(n == 1 for _, n in log.calls), log.calls  # no prefill: one token per model per step


def test_warmed_caches_make_a_stored_traces_first_switch_read_no_prefix(pair, guided, monkeypatch) -> None:
    """A trace opened from the store has no held caches: its first switch prefilled the prompt and prefix. After
    core.decoding.caches.warm_caches (what the app runs when a trace opens) it resumes as later switches do, and
    gives the same child."""
    from core.decoding.caches import warm_caches

    CACHES.clear()
    cold = core.takeover(pair, guided, {6: _other(guided, 6)})
    CACHES.clear()
    assert warm_caches(pair, guided) and not warm_caches(pair, guided)  # once: the second finds them held
    log = FeedLog(pair, monkeypatch)
    warmed = core.takeover(pair, guided, {6: _other(guided, 6)}, lookahead=1)
    assert all(n == 1 for _, n in log.calls), log.calls  # no prefill: one token per model per step
    assert _tokens(warmed) == _tokens(cold) and warmed.key == cold.key
    np.testing.assert_allclose(warmed.metrics["kl_base_reason"], cold.metrics["kl_base_reason"], rtol=1e-4, atol=1e-5)


def test_streamed_tokens_are_the_childs_tokens(pair, guided) -> None:
    seen: list[tuple[int, int, str]] = []
    child = core.takeover(pair, guided, {5: "reason"}, on_token=lambda *a: seen.append(a))
    assert [pos for pos, _, _ in seen] == list(range(5, len(child)))
    assert [tok for _, tok, _ in seen] == child.token_ids[5:].tolist()
    assert [src for _, _, src in seen] == [str(s) for s in child.source[5:]]


def test_branch_is_the_one_switch_takeover(pair, guided) -> None:
    a = core.branch(pair, guided, 6)
    b = core.takeover(pair, guided, {6: "reason"}, then="base")
    assert _tokens(a) == _tokens(b) and a.key == b.key


@pytest.mark.parametrize("at, match", [
    ({}, "maps response positions"), ({-1: "reason"}, "non-negative"), ({2: 1.5}, "takes 'reason'"), ({2: ""}, "typed text"),
    ({2: []}, "empty"), ({2: 10**9}, "outside the vocabulary"), ({2: ["reason", 5]}, "takes 'reason'"),
])
def test_bad_switches_are_clear_errors(pair, guided, at, match) -> None:
    with pytest.raises(InvalidInputError, match=match):
        core.takeover(pair, guided, at)


def test_bad_then_and_positions_are_clear_errors(pair, guided) -> None:
    with pytest.raises(InvalidInputError, match="then must be one of"):
        core.takeover(pair, guided, {1: "reason"}, then="someone")
    with pytest.raises(InvalidInputError, match="outside the trace"):
        core.takeover(pair, guided, {len(guided) + 1: "reason"})


def test_a_response_that_ended_takes_no_switch_past_its_end(pair, guided) -> None:
    """At len(trace) a switch continues a response that was cut short; after an end-of-sequence token it would
    write past the end (a second answer glued on)."""
    n = len(guided)
    cut = core.takeover(pair, guided, {n: "reason"}, max_new_tokens=n + 3)  # cut short: it may go on
    assert len(cut) > n and list(cut.token_ids[:n]) == list(guided.token_ids)
    ended = dataclasses.replace(pair, eos_ids=frozenset({int(guided.token_ids[-1])}))
    with pytest.raises(InvalidInputError, match=rf"outside the trace \(0..{n - 1}\): the response ended"):
        core.takeover(ended, guided, {n: "reason"})
    assert core.takeover(ended, guided, {n - 1: "reason"}).key  # the end itself can still be replaced


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.integers(0, 30), st.one_of(st.sampled_from(["reason", "base"]), st.integers(0, 50)),
                       min_size=1, max_size=4))
def test_switches_flatten_and_keep_every_position(at) -> None:
    flat = switches(at, vocab_size=64)
    assert flat == {int(p): w for p, w in at.items()}
    lists = {p: [w, w] if isinstance(w, int) else w for p, w in at.items()}
    if all(isinstance(w, int) for w in at.values()) and all(p + 1 not in at for p in at):
        assert switches(lists, 64) == {**{p: w for p, w in at.items()}, **{p + 1: w for p, w in at.items()}}


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 20), min_size=1, max_size=3, unique=True))
def test_round_trip_at_any_set_of_positions(pair, guided, positions) -> None:
    """Flip any positions to the other side, then back: the parent returns, token for token."""
    flipped = {p: ("base" if guided.source[p] == "reason" else "reason") for p in positions}
    child = core.takeover(pair, guided, flipped)
    back = core.takeover(pair, child, {p: str(guided.source[p]) for p in positions})
    np.testing.assert_array_equal(back.token_ids, guided.token_ids)
    assert [str(s) for s in back.source] == [str(s) for s in guided.source]


def test_the_switchboard_flips_and_undoes(pair, guided, tmp_path) -> None:
    """flipped + set_switches: flip a token on, a takeover off, then undo both (back to the root)."""
    from core.decoding.takeover import flipped, set_switches

    store = core.TraceStore(tmp_path / "store")
    store.put(guided)
    r = next(i for i, s in enumerate(guided.source) if s == "reason")
    b = next(i for i, s in enumerate(guided.source) if s == "base" and i > r)
    one = set_switches(pair, guided, flipped(guided, b), store=store)
    assert one.meta["switches"] == {str(b): "reason"} and one.source[b] == "reason"
    two = set_switches(pair, one, flipped(one, r), store=store)
    assert two.meta["switches"] == {str(r): "base"} or two.meta["switches"] == {str(r): "base", str(b): "reason"}
    assert two.source[r] == "base"
    back = set_switches(pair, two, {}, store=store)
    assert back.key == guided.key
    again = set_switches(pair, two, flipped(two, r), store=store)  # a switched position loses its switch
    assert r not in {int(p) for p in again.meta.get("switches") or {}}
    assert _tokens(again)[0][:b] == _tokens(guided)[0][:b]


def test_exports_carry_the_switches(pair, guided, tmp_path) -> None:
    """The switch list travels with the child: in meta (JSONL, lossless) and as a per-token CSV column."""
    import pandas as pd

    child = core.takeover(pair, guided, {2: "reason", 6: 5})
    frame = child.frame()
    assert frame.loc[2, "switch"] == "reason" and frame.loc[6, "switch"] == "5" and frame.loc[0, "switch"] == ""
    core.export([child, guided], tmp_path / "both.csv")
    table = pd.read_csv(tmp_path / "both.csv", keep_default_na=False)
    mine = table[table["trace_key"] == child.key].set_index("pos")["switch"]
    assert mine[2] == "reason" and str(mine[6]) == "5" and set(table[table["trace_key"] == guided.key]["switch"]) == {""}
    core.export([child], tmp_path / "child.jsonl")
    assert core.read_jsonl(tmp_path / "child.jsonl")[0].meta["switches"] == {"2": "reason", "6": 5}


# -- the one child-trace kernel: continuations, no-op switches, typed text, fans ---------------------------


@pytest.fixture(scope="module")
def sampled(pair) -> core.Trace:
    return core.generate(pair, PROMPTS[1], core.make_policy("guided", **GUIDED), max_new_tokens=24,
                         temperature=0.9, seed=3)


@pytest.fixture(scope="module")
def switched(pair, guided) -> core.Trace:
    """A child with switches of its own (a takeover flipped where it changes the text, and a given token)."""
    p = next(i for i in flip_changes(guided) if i >= 2)
    return core.takeover(pair, guided, {p: _other(guided, p), p + 3: 7})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["guided", "sampled", "switched"]), st.integers(0, 22), st.sampled_from(["reason", "base"]),
       st.sampled_from(["policy", "base"]), st.sampled_from([0.0, 0.7]), st.integers(0, 2**20))
def test_a_continuation_row_is_the_takeover_of_its_seed(pair, guided, sampled, switched, which, pos, who, then,
                                                        temperature, seed) -> None:
    """Effects' and the curve's rows (continue_batch) and `core.takeover` are one kernel: row i gives the tokens
    and sources of takeover(..., {pos: who}, then, temperature, seed=seeds[i]). Held on the code before the
    kernel was one (two decoders), and must hold after."""
    from core.instruments.continuations import continue_batch

    trace = {"guided": guided, "sampled": sampled, "switched": switched}[which]
    pos = min(pos, len(trace) - 1)
    seeds = [seed, seed + 1]
    rows = continue_batch(pair, trace, pos, [who, who], seeds, then=then, temperature=temperature)
    for s, row in zip(seeds, rows):
        alone = core.takeover(pair, trace, {pos: who}, then=then, temperature=temperature, seed=s)
        assert _tokens(row) == _tokens(alone)
        assert row.meta["parent"] == trace.key and row.meta["branch"] == {"pos": pos, "who": who}


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["guided", "sampled", "switched"]), st.lists(st.integers(0, 22), min_size=1, max_size=2,
                                                                     unique=True))
def test_a_switch_that_changes_no_token_is_the_parent_and_stores_nothing(pair, guided, sampled, switched,
                                                                          tmp_path_factory, which, positions) -> None:
    trace = {"guided": guided, "sampled": sampled, "switched": switched}[which]
    store = core.TraceStore(tmp_path_factory.mktemp("noop"))
    at = {p: _other(trace, p) for p in positions if p < len(trace) and str(trace.source[p]) != "forced"}
    if not at:
        return
    child = core.takeover(pair, trace, at, store=store)
    then, sampling = tk.resolve_then(trace, "policy"), tk.child_sampling(trace)
    decoded = tk.decode_children(pair, trace, [tk._child(pair, trace, min(at), switches(at, pair.vocab_size), then,
                                                         sampling)], then, sampling)[0]  # no no-op rule: decoded
    if decoded.token_ids.tolist() == trace.token_ids.tolist():
        assert child is trace and store.keys() == []
    else:
        assert child.key != trace.key and _tokens(child) == _tokens(decoded) and store.keys() == [child.key]


def test_flip_changes_are_the_flips_that_change_the_text(pair, guided) -> None:
    """On a greedy trace, a flip makes a new trace exactly where `flip_changes` marks; elsewhere it gives the
    parent back, decided without decoding."""
    from core.decoding.takeover import flipped, set_switches

    made = {p for p in range(len(guided)) if set_switches(pair, guided, flipped(guided, p)) is not guided}
    assert made == set(flip_changes(guided)) and made  # (the models agree nowhere here: see the self pair's test)


def test_typed_text_is_forced_and_no_takeover(pair, guided, tmp_path) -> None:
    ids = pair.encode(" Let me think")
    assert len(ids) > 1
    store = core.TraceStore(tmp_path / "store")
    typed = core.takeover(pair, guided, {4: " Let me think"}, then="base", store=store)
    given = core.takeover(pair, guided, {4: ids}, then="base")
    assert typed.key == given.key and _tokens(typed) == _tokens(given)
    assert typed.token_ids[4:4 + len(ids)].tolist() == ids and set(typed.source[4:4 + len(ids)]) == {"forced"}
    assert typed.n_takeovers == int(np.sum(typed.source == "reason")) == guided.source[:4].tolist().count("reason")
    row = store.summaries().set_index("key").loc[typed.key]
    assert row["n_takeovers"] == typed.n_takeovers and row["rho"] == pytest.approx(typed.n_takeovers / len(typed))
    assert [s["to"] for s in typed.meta["switched"]] == ["forced"] * len(ids)
    # exports keep the forced sources and the typed ids; the HTML page counts them apart from the takeovers
    core.export([typed], tmp_path / "typed.jsonl")
    back = core.read_jsonl(tmp_path / "typed.jsonl")[0]
    assert _tokens(back) == _tokens(typed) and back.n_takeovers == typed.n_takeovers
    assert back.meta["switches"] == {str(4 + i): t for i, t in enumerate(ids)}
    core.export([typed], tmp_path / "typed.csv")
    import pandas as pd

    table = pd.read_csv(tmp_path / "typed.csv", keep_default_na=False).set_index("pos")
    assert (table.loc[4:3 + len(ids), "source"] == "forced").all()
    assert [int(x) for x in table.loc[4:3 + len(ids), "switch"]] == ids
    page = core.export([typed], tmp_path / "typed.html").read_text(encoding="utf-8")
    assert f"{len(typed)} / {typed.n_takeovers} (" in page and f"{len(ids)} typed or forced" in page


def test_words_reason_and_base_keep_their_meaning(pair, guided) -> None:
    p = flip_changes(guided)[0]
    child = core.takeover(pair, guided, {p: _other(guided, p)})
    assert str(child.source[p]) == _other(guided, p) and "forced" not in {str(s) for s in child.source}


def test_a_fan_is_n_sampled_children_each_the_single_call_of_its_seed(pair, guided, monkeypatch) -> None:
    from core.decoding.engine import Decoder
    from core.decoding.sampling import sample_seeds

    rows: list[int] = []
    real = Decoder.__init__

    def spy(self, pair_, batch, *args, **kwargs):
        rows.append(len(batch))
        real(self, pair_, batch, *args, **kwargs)

    monkeypatch.setattr(Decoder, "__init__", spy)
    p = 5
    fan = core.takeover(pair, guided, {p: "reason"}, samples=4, temperature=0.8, seed=11)
    assert rows == [4], "one engine batch"
    assert isinstance(fan, list) and len({c.key for c in fan}) == 4
    assert len({tuple(c.token_ids.tolist()) for c in fan}) > 1, "samples differ"
    for s, child in zip(sample_seeds(11, p, 4), fan):
        alone = core.takeover(pair, guided, {p: "reason"}, temperature=0.8, seed=s)
        assert alone.key == child.key and _tokens(alone) == _tokens(child)
        assert child.meta["sampling"]["temperature"] == 0.8 and child.meta["sampling"]["seed"] == s
    assert [c.meta["fan"] for c in fan] == [{"sample": i} for i in range(4)]  # which draw: a label, not the key
    CACHES.clear()
    again = core.takeover(pair, guided, {p: "reason"}, samples=4, temperature=0.8, seed=11)
    assert [c.key for c in again] == [c.key for c in fan] and [_tokens(c) for c in again] == [_tokens(c) for c in fan]
    greedy_default = core.takeover(pair, guided, {p: "reason"}, samples=2)
    assert all(c.meta["sampling"]["temperature"] > 0 for c in greedy_default)  # a greedy trace's fan samples
    with pytest.raises(InvalidInputError, match="samples"):
        core.takeover(pair, guided, {p: "reason"}, samples=0)


def test_on_trace_sees_each_new_child_before_it_is_stored_once(pair, guided, tmp_path) -> None:
    events: list[tuple[str, str]] = []

    class Store(core.TraceStore):
        def put(self, trace, **kw):
            events.append(("put", trace.key, trace.meta.get("graded")))
            return super().put(trace, **kw)

    def grade(trace):
        events.append(("seen", trace.key, None))
        trace.meta["graded"] = True
        return trace

    store = Store(tmp_path / "store")
    p = flip_changes(guided)[0]
    child = core.takeover(pair, guided, {p: _other(guided, p)}, store=store, on_trace=grade)
    assert events == [("seen", child.key, None), ("put", child.key, True)]
    events.clear()
    assert core.takeover(pair, guided, {p: _other(guided, p)}, store=store, on_trace=grade).key == child.key
    assert events == [], "a stored child is read back: neither graded nor stored again"


def test_typed_text_of_one_token_reads_as_typed_and_a_chosen_token_as_forced(pair, guided) -> None:
    """Audit 31 D5: typed text of one token was labelled "⇄ #4 forced ' The'" (only a run of two or more forced
    tokens read as typed). The record keeps which forced tokens were typed (meta["typed"], outside the key)."""
    from core.decoding.takeover import flipped, set_switches
    from core.views.presentation import switch_text, who_wrote

    word = next(w for w in (" The", " the", " a", "a", "1", "=") if len(pair.encode(w)) == 1)  # the tiny tokenizer's
    ids = pair.encode(word)
    typed = core.takeover(pair, guided, {4: word}, then="base")
    edited = set_switches(pair, guided, {4: ids}, then="base")  # the app's edit: the typed text's ids as a list
    chosen = core.takeover(pair, guided, {4: ids[0]}, then="base")  # a hover-card alternative: one id
    assert typed.key == edited.key == chosen.key  # the same tokens from the same switches: one store key
    assert "typed" not in typed.meta["request"]
    assert typed.meta["typed"] == edited.meta["typed"] == {"4": 1} and chosen.meta["typed"] == {}
    say = pair.token_text
    assert switch_text(typed, say) == switch_text(edited, say) == f"✎ #4 {word!r}"
    assert switch_text(chosen, say) == f"⇄ #4 forced {word!r}"
    assert (who_wrote(typed, 4), who_wrote(chosen, 4)) == ("typed by you", "forced by you")
    # a child that keeps the typed token keeps it typed: a flip after it, and one before it (which
    # re-submits the typed token as an id, as the switch list's toggles do)
    changes = flip_changes(typed)
    after = next(p for p in changes if p > 4)
    before = next(p for p in changes if p < 4)
    for p in (after, before):
        child = set_switches(pair, typed, flipped(typed, p), then="base")
        assert child.key != typed.key and int(child.token_ids[4]) == ids[0]
        assert child.meta["typed"] == {"4": 1}, p
    # a typed run cut by a new switch keeps the tokens before the cut
    three = core.takeover(pair, guided, {4: " Let me think"}, then="base")
    n = len(pair.encode(" Let me think"))
    assert three.meta["typed"] == {"4": n} and n > 2
    cut = set_switches(pair, three, {**{p: w for p, w in tk.switches_in_force(three).items() if p < 5}, 5: "reason"},
                       then="base")
    assert cut.meta["typed"] == {"4": 1}
    assert switch_text(cut, say).startswith("⇄ #5 reasoner")
