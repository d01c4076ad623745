"""The evaluation harness: pass@k, recovery, sharding, summaries, markdown, and end-to-end runs."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import core
from core.errors import InvalidInputError
from core.evaluation import harness as ev
from core.evaluation import sweep as sw


# -- pure maths --------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_subset_enumeration(nck):
    n, c, k = nck
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert ev.pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_k_hand_values_and_errors():
    assert ev.pass_at_k(8, 0, 8) == 0.0
    assert ev.pass_at_k(8, 1, 8) == 1.0
    assert ev.pass_at_k(4, 1, 1) == 0.25
    assert ev.pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)
    with pytest.raises(InvalidInputError):
        ev.pass_at_k(3, 4, 1)
    with pytest.raises(InvalidInputError):
        ev.pass_at_k(3, 1, 4)


def test_recovery():
    assert ev.recovery(0.7, 0.4, 0.9) == pytest.approx(0.6)
    assert ev.recovery(0.4, 0.4, 0.9) == 0.0
    assert ev.recovery(1.0, 0.4, 0.9) == pytest.approx(1.2)
    assert math.isnan(ev.recovery(0.5, 0.5, 0.5))


@given(st.integers(0, 40), st.integers(1, 7))
def test_shards_are_disjoint_and_cover(n_items, n):
    items = list(range(n_items))
    parts = [ev.shard_of(items, (i, n)) for i in range(n)]
    assert sorted(itertools.chain.from_iterable(parts)) == items
    assert parts == [ev.shard_of(items, (i, n)) for i in range(n)]  # deterministic
    assert ev.shard_of(items, None) == items


@given(st.floats(0.0, 0.5), st.floats(1.0, 300.0), st.integers(1, 512))
def test_early_rate_gives_the_nearest_whole_prefix(rho, mean_tokens, limit):
    rate = ev.early_rate_for(rho, mean_tokens, limit)
    n = math.ceil(rate * limit - 1e-9)  # what EarlyOnly hands over
    assert n == min(limit, max(1, round(rho * mean_tokens)))


def test_bad_shard_is_rejected():
    with pytest.raises(InvalidInputError, match="shard"):
        ev.shard_of([1, 2], (2, 2))


def _records(rows):
    return pd.DataFrame(rows, columns=["benchmark", "policy", "problem", "index", "sample", "correct", "tokens",
                                       "taken", "key"])


def test_summarise_hand_computed():
    rows = []
    # base: problem 0 right in 1 of 2 samples, problem 1 never; 10 tokens each, nothing taken over
    for idx, oks in ((0, (True, False)), (1, (False, False))):
        for s, ok in enumerate(oks):
            rows.append(["b", "base", f"p{idx}", idx, s, ok, 10, 0, None])
    # reason: everything right, 20 tokens each, all taken over
    for idx in (0, 1):
        for s in (0, 1):
            rows.append(["b", "reason", f"p{idx}", idx, s, True, 20, 20, None])
    # guided: problem 0 right twice, problem 1 right once; 10 tokens, 1 taken
    for idx, oks in ((0, (True, True)), (1, (True, False))):
        for s, ok in enumerate(oks):
            rows.append(["b", "guided", f"p{idx}", idx, s, ok, 10, 1, None])
    out = ev.policy_table(_records(rows)).set_index("policy")
    assert out.loc["base", "accuracy"] == 0.25 and out.loc["base", "pass@k"] == 0.5 and out.loc["base", "k"] == 2
    assert out.loc["reason", "rho"] == 1.0 and out.loc["base", "rho"] == 0.0
    assert out.loc["guided", "rho"] == pytest.approx(0.1)
    assert out.loc["guided", "accuracy"] == 0.75
    assert out.loc["guided", "recovery"] == pytest.approx((0.75 - 0.25) / (1 - 0.25))
    assert out.loc["guided", "recovery@k"] == pytest.approx((1.0 - 0.5) / (1 - 0.5))
    assert out.loc["reason", "recovery"] == pytest.approx(1.0) and out.loc["base", "recovery"] == 0.0
    assert np.isnan(out.loc["base", "wrong"]) and np.isnan(out.loc["base", "ungraded"])  # no rules recorded
    one = ev.policy_table(_records(rows), k=1).set_index("policy")
    assert one.loc["guided", "pass@k"] == one.loc["guided", "accuracy"]
    with pytest.raises(InvalidInputError, match="pass@3"):
        ev.policy_table(_records(rows), k=3)


def test_ungraded_is_counted_apart_from_wrong():
    rules = ["boxed", None, "phrase", None, "last_number", "boxed"]
    correct = [True, False, False, False, True, False]
    rows = [["b", "p", f"q{i}", i, 0, ok, 10, 0, None, rule] for i, (ok, rule) in enumerate(zip(correct, rules))]
    frame = pd.DataFrame(rows, columns=list(ev.RECORD_COLUMNS))
    row = ev.policy_table(frame, base="p", reference=0.9).iloc[0]
    assert row["accuracy"] == pytest.approx(2 / 6)
    assert row["wrong"] == pytest.approx(2 / 6) and row["ungraded"] == pytest.approx(2 / 6)
    assert row["accuracy"] + row["wrong"] + row["ungraded"] == pytest.approx(1.0)


def test_markdown_table():
    frame = pd.DataFrame([
        {"benchmark": "a", "policy": "base", "accuracy": 0.5, "rho": 0.0, "recovery": 0.0},
        {"benchmark": "a", "policy": "x|y", "accuracy": 0.25, "rho": 0.1, "recovery": float("nan")},
    ])
    md = ev.to_markdown(frame, columns=["accuracy", "recovery"]).splitlines()
    assert md[0] == "| policy | accuracy | recovery |"
    assert md[2] == "| base | 0.500 | 0.000 |"
    assert md[3] == "| x\\|y | 0.250 | – |"
    two = pd.concat([frame, frame.assign(benchmark="b", accuracy=[0.9, 0.8])])
    md2 = ev.to_markdown(two, columns=["accuracy"]).splitlines()
    assert md2[0] == "| policy | a: accuracy | b: accuracy |"
    assert md2[3] == "| x\\|y | 0.250 | 0.800 |"


# -- end to end on a tiny random pair ----------------------------------------------------------
class CountingStore:
    """A minimal in-memory store that counts writes."""

    def __init__(self):
        self.traces, self.puts = {}, 0

    def __contains__(self, key):
        return key in self.traces

    def get(self, key):
        return self.traces[key]

    def put(self, trace):
        self.puts += 1
        self.traces[trace.key] = trace
        return trace.key


PROBLEMS = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "gold": str(2 * i)} for i in range(5)]


def test_evaluate_runs_stores_and_reuses(qwen_pair):
    store = CountingStore()
    policies = {"early": core.EarlyOnly(rate=0.25), "random": core.RandomPositions(rate=0.5, seed=1)}
    first = ev.evaluate(qwen_pair, PROBLEMS, policies, store=store, max_new_tokens=8, batch_size=2)
    assert list(first["policy"]) == ["base", "reason", "early", "random"]
    assert store.puts == 4 * len(PROBLEMS)
    assert all(t.meta["correct"] is not None for t in store.traces.values())
    out = first.set_index("policy")
    assert out.loc["base", "rho"] == 0.0 and out.loc["reason", "rho"] == 1.0
    records = ev.run_records(qwen_pair, PROBLEMS, {"early": core.EarlyOnly(rate=0.25)}, store=store,
                             max_new_tokens=8, batch_size=2)
    assert (records["taken"] == np.minimum(2, records["tokens"])).all()  # ceil(0.25 · 8) = 2
    again = ev.evaluate(qwen_pair, PROBLEMS, policies, store=store, max_new_tokens=8, batch_size=3)
    assert store.puts == 4 * len(PROBLEMS)  # nothing regenerated
    pd.testing.assert_frame_equal(first, again)
    parts = [ev.run_records(qwen_pair, PROBLEMS, {"random": policies["random"]}, store=store, max_new_tokens=8,
                            shard=(i, 2)) for i in range(2)]
    merged = pd.concat(parts)
    assert sorted(merged["problem"]) == sorted(p["id"] for p in PROBLEMS)
    assert sorted(merged["index"]) == list(range(len(PROBLEMS)))  # global indices, unique across shards
    whole = ev.run_records(qwen_pair, PROBLEMS, {"random": policies["random"]}, store=store, max_new_tokens=8)
    pd.testing.assert_frame_equal(ev.policy_table(merged), ev.policy_table(whole))
    assert store.puts == 4 * len(PROBLEMS)


def test_grades_match_an_independent_check(qwen_pair):
    from core.evaluation.grading import extract_answer

    forced_right = {"id": "f", "prompt": "Say four.", "gold": "4"}
    ids = qwen_pair.encode(" \\boxed{4}")
    policy = core.Forced(at=dict(enumerate(ids)))
    rec = ev.run_records(qwen_pair, [forced_right, {**forced_right, "id": "g", "gold": "5"}], {"forced": policy},
                         max_new_tokens=len(ids))
    assert list(rec["correct"]) == [True, False]
    assert extract_answer(" \\boxed{4}") == "4"


def test_budget_sweep_rows_and_matched_baselines(qwen_pair):
    store = CountingStore()
    sweep = sw.budget_sweep(qwen_pair, PROBLEMS, PROBLEMS[:3], ratios=(0.2, 0.5), store=store, max_new_tokens=8)
    ends = sweep[sweep["config"] == sweep["policy"]]
    assert list(ends["policy"]) == ["base", "reason"]
    assert set(sweep["reference"]) == {"policy reason"}  # no thinking model given: the guide, and it says so
    calib = np.concatenate([np.asarray(t.metrics["entropy_base"]) for t in
                            (store.get(k) for k in store.traces) if t.meta["problem"]["id"] in ("q0", "q1", "q2")
                            and t.meta["policy"]["name"] == "base_only" and t.meta["sampling"]["sample"] == 0])
    for ratio in (0.2, 0.5):
        rows = sweep[sweep["ratio"] == ratio].set_index("policy")
        assert "guided" in rows.index and rows.loc["guided", "tau"] >= 0 and rows.loc["guided", "window"] == 16
        assert 0.0 <= rows.loc["guided", "rho"] <= 1.0
        assert rows.loc["guided", "budget"] is None or math.isnan(rows.loc["guided", "budget"])
        # the entropy-gated variant: threshold = the (1 - r) quantile of the calibration rollouts' base entropy
        assert rows.loc["entropy_gated", "threshold"] == pytest.approx(np.quantile(calib, 1 - ratio))
    # the paper's fixed-rate baselines: once per benchmark, at ρ = 0.25
    fixed = sweep[sweep["config"] == "ρ=0.25"].set_index("policy")
    assert set(fixed.index) == {"random_positions", "early_only"} and (fixed["matched_rho"] == 0.25).all()
    # everything generated once is reused: a second sweep writes nothing new
    puts = store.puts
    sw.budget_sweep(qwen_pair, PROBLEMS, PROBLEMS[:3], ratios=(0.2, 0.5), store=store, max_new_tokens=8)
    assert store.puts == puts


def test_baselines_are_matched_to_guideds_realised_rho(qwen_pair):
    """The random / early baselines take Guided's REALISED ρ (from its traces), not the calibration r."""
    keep: dict = {}
    limit = 12
    sweep = sw.budget_sweep(qwen_pair, PROBLEMS, PROBLEMS[:3], ratios=(0.3,), max_new_tokens=limit, keep=keep)
    guided = keep["r=0.3"]
    assert len(guided) == len(PROBLEMS)
    tokens = sum(len(t) for t in guided)
    taken = sum(int(sum(s != "base" for s in t.source)) for t in guided)
    rho = taken / tokens  # computed here, independently of the harness
    assert 0 < rho < 1 and rho != pytest.approx(0.3)  # else the test could not tell r from ρ
    rows = sweep[sweep["config"] == "r=0.3"].set_index("policy")
    assert rows.loc["guided", "rho"] == pytest.approx(rho)
    assert rows.loc["random_positions", "matched_rho"] == pytest.approx(rho)
    assert rows.loc["early_only", "matched_rho"] == pytest.approx(rho)
    random_traces, early_traces = keep["random_positions (r=0.3)"], keep["early_only (r=0.3)"]
    assert all(t.meta["policy"]["params"]["rate"] == pytest.approx(rho) for t in random_traces)
    # EarlyOnly's prefix is dithered per row (issue 32): the whole number just below or above ρ · (Guided's
    # mean length), so that its mean is that length, not rounded to a whole token
    mean_prefix = rho * tokens / len(guided)
    rates = {t.meta["policy"]["params"]["rate"] for t in early_traces}
    assert len(rates) == 1 and rates.pop() * limit == pytest.approx(mean_prefix)
    assert all(t.meta["policy"]["params"]["seed"] is not None for t in early_traces)
    for t in early_traces:
        src = list(t.source)
        n_early = src.index("base") if "base" in src else len(src)
        assert n_early in (math.floor(mean_prefix), math.floor(mean_prefix) + 1) or n_early == len(src)
        assert "reason" not in src[n_early:]
    # and the random baseline's realised rate is ρ's binomial draw: within 4 standard deviations
    n = sum(len(t) for t in random_traces)
    got = sum(int(sum(s != "base" for s in t.source)) for t in random_traces) / n
    assert abs(got - rho) <= 4 * math.sqrt(rho * (1 - rho) / n) + 1e-9


def test_thinking_reference_runs_alone_and_is_the_default_reference(qwen_pair):
    """A thinking pair whose model is the guide in the guide's format must write exactly ReasonOnly's tokens
    (greedy), with the guide scoring them lazily; it becomes the recovery reference."""
    from core.evaluation.thinking import from_models

    thinking = from_models(qwen_pair, qwen_pair.reason, fmt=qwen_pair.formats["reason"].spec)
    keep: dict = {}
    records = ev.run_records(qwen_pair, PROBLEMS, {"reason": core.ReasonOnly()}, max_new_tokens=8, keep=keep)
    solo = ev.thinking_records(thinking, PROBLEMS, max_new_tokens=8, keep=keep)
    for a, b in zip(keep["reason"], keep["thinking"]):
        assert list(a.token_ids) == list(b.token_ids)
        assert set(b.source) == {"base"} and not np.isnan(b.metrics["kl_base_reason"]).any()
        assert np.allclose(b.metrics["kl_base_reason"], 0, atol=1e-5)  # the same model scores its own tokens
    assert (solo["taken"] == 0).all() and list(solo["correct"]) == list(records["correct"])
    from core.decoding.policies import policy_from_record
    from core.evaluation.thinking import Solo

    assert isinstance(policy_from_record(keep["thinking"][0].meta["policy"]), Solo)  # stored records rebuild
    table = ev.evaluate(qwen_pair, PROBLEMS, {}, max_new_tokens=8, thinking=thinking).set_index("policy")
    assert list(table.index) == ["base", "reason", "thinking"]
    assert set(table["reference"]) == {"policy thinking"}
    with pytest.raises(InvalidInputError, match="not a policy label"):
        ev.evaluate(qwen_pair, PROBLEMS[:1], {}, max_new_tokens=2, reference="thinkin")


def test_stored_policy_table_from_graded_roots():
    """The Dataset page's recovery table: accuracy per stored configuration (branches and ungraded traces
    left out), recovery between the stored BaseOnly and ReasonOnly traces."""
    from fakes import make_trace

    def trace(policy, problem, correct, parent=None, seed=0):
        return make_trace(10, seed=seed, reason_share=0.0 if policy["name"] == "base_only" else 0.3,
                          meta={"policy": policy, "problem": {"id": problem, "prompt": "p"}, "correct": correct,
                                "parent": parent})

    base, reason = {"name": "base_only", "params": {}}, {"name": "reason_only", "params": {}}
    guided = {"name": "guided", "params": {"tau": 1.5, "lam": 2.0, "window": 16, "score": "cross_entropy"}}
    traces = [trace(base, "a", False), trace(base, "b", True), trace(reason, "a", True), trace(reason, "b", True),
              trace(guided, "a", True), trace(guided, "b", False), trace(guided, "a", False, parent="x"),
              trace(guided, "b", None, seed=3)]
    table = ev.stored_policy_table(traces).set_index("name")
    label = ev.policy_config_label(guided)
    assert label.startswith("guided ") and '"tau": 1.5' in label and "cross_entropy" not in label
    assert table.loc[label, "accuracy"] == 0.5 and table.loc[label, "problems"] == 2  # branch, ungraded left out
    assert table.loc["base_only", "accuracy"] == 0.5 and table.loc["reason_only", "accuracy"] == 1.0
    assert table.loc[label, "recovery"] == pytest.approx(0.0) and table.loc["reason_only", "recovery"] == 1.0
    assert set(table["policy"]) == {"base_only", "reason_only", "guided"}
    with pytest.raises(core.InvalidInputError, match="BaseOnly and ReasonOnly"):
        ev.stored_policy_table(traces[4:])


def test_stored_recovery_compares_each_configuration_on_the_problems_it_shares_with_both_ends(caplog):
    """Base runs on problems no other policy ran (c, d: both wrong) must not move a recovery: over all four
    the base would score 0.25 and guided's recovery read (0.5 - 0.25) / (1 - 0.25) = 1/3 instead of 0."""
    from fakes import make_trace

    def trace(name, problem, correct):
        return make_trace(6, seed=len(problem), meta={"policy": {"name": name, "params": {}}, "correct": correct,
                                                      "problem": {"id": problem, "prompt": "p"}})

    traces = [trace("base_only", "a", False), trace("base_only", "b", True), trace("base_only", "c", False),
              trace("base_only", "d", False), trace("reason_only", "a", True), trace("reason_only", "b", True),
              trace("guided", "a", True), trace("guided", "b", False), trace("early_only", "e", True)]
    with caplog.at_level("WARNING"):
        table = ev.stored_policy_table(traces).set_index("name")
    assert "early_only" in caplog.text and "early_only" not in table.index
    assert table.loc["guided", "recovery"] == pytest.approx(0.0) and table.loc["guided", "problems"] == 2
    assert table.loc["base_only", "accuracy"] == 0.5 and table.loc["base_only", "problems"] == 2
    with pytest.raises(core.InvalidInputError, match="share none"):
        ev.stored_policy_table([trace("base_only", "a", True), trace("reason_only", "b", True)])


def test_a_problem_without_gold_says_what_to_rename() -> None:
    """No API keyword alone (the CLI has no --answer-field): the names to rename to, and the keyword for Python."""
    with pytest.raises(InvalidInputError) as err:
        ev.require_gold([core.Problem("a", "1+1?", "2"), core.Problem("b", "2+2?")])
    assert "1 of 2 problems" in str(err.value) and str(err.value).endswith(
        "rename the answer's field to one of answer, final_answer, gold, target, expected_answer (in Python, "
        "load_problems(..., answer_field=NAME) reads another)")
