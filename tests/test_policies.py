"""core.policies: each rule on hand-made steps, and on real runs replayed against an independent reading
of the rule (gate on the realised score history, exact-fraction budgets, per-step random draws)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import core
from core.annotate.spikes import Gate, calibrate_gate, gate_fires
from core.decoding.policies import (
    POLICIES,
    BaseOnly,
    EarlyOnly,
    EntropyGated,
    Forced,
    Guided,
    RandomPositions,
    ReasonOnly,
    Step,
    make_policy,
    policy_from_record,
    row_identity,
    within_budget,
)
from core.scoring.registry import score_values

PROMPT = "What is 2+3?"  # the tiny random models write no EOS on this one for 48+ tokens, whatever the policy
PROMPTS = [PROMPT, "Tom has 3 boxes of 4 apples. He gives away 2. How many apples are left?"]



def step(t: int, score=None, entropy=None, history=None, taken=None, limit: int = 100, rows: int = 1,
         ids=None) -> Step:
    as_array = lambda v, fill: np.full(rows, fill, dtype=float) if v is None else np.asarray(v, dtype=float)
    return Step(t=t, score=as_array(score, 0.0), entropy_base=as_array(entropy, 0.0),
                history=history if history is not None else [[] for _ in range(rows)],
                taken=np.zeros(rows, dtype=np.int64) if taken is None else np.asarray(taken), limit=limit,
                rows=None if ids is None else np.asarray(ids, dtype=np.uint64))


def cap(budget: float | None, limit: int) -> float:
    """ceil(budget · limit) with the budget read as the decimal the user typed (exact arithmetic); None: no cap."""
    return math.inf if budget is None else math.ceil(Fraction(str(budget)) * limit)


# -- the budget: a share of the whole response (max_new_tokens), off by default ----------------------


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.none(), st.integers(0, 1000)), st.integers(1, 400), st.one_of(st.none(), st.integers(0, 50)))
def test_greedy_takeovers_fill_the_budget_exactly(milli, limit: int, max_takeovers) -> None:
    """Taking over whenever allowed takes the first min(ceil(budget·limit), max_takeovers) steps, then none:
    early steps are never starved by the cap (issue 12)."""
    budget = None if milli is None else milli / 1000
    total = min(cap(budget, limit), math.inf if max_takeovers is None else max_takeovers)
    taken = 0
    for t in range(limit):
        ok = bool(within_budget(np.array([taken]), limit, budget, max_takeovers)[0])
        assert ok == (t < total), (t, taken, total)
        taken += ok
    assert taken == min(total, limit)


def test_within_budget_edges() -> None:
    assert not within_budget(np.array([0]), 100, 0.0, None)[0]
    assert within_budget(np.array([0]), 100, 0.001, None)[0]  # ceil(0.1) = 1: one takeover allowed
    assert not within_budget(np.array([1]), 100, 0.001, None)[0]
    assert within_budget(np.array([9]), 100, 0.1, None)[0] and not within_budget(np.array([10]), 100, 0.1, None)[0]
    assert within_budget(np.array([10**6]), 100, None, None)[0]  # no cap at all
    assert not within_budget(np.array([2]), 50, 1.0, 2)[0] and not within_budget(np.array([2]), 50, None, 2)[0]
    np.testing.assert_array_equal(within_budget(np.array([2, 3]), 10, 0.3, None), [True, False])


# -- each rule on hand-made steps -------------------------------------------------------------------


def test_rules_on_hand_made_steps() -> None:
    s = step(4, rows=3)
    np.testing.assert_array_equal(BaseOnly().takeover(s), [False] * 3)
    np.testing.assert_array_equal(ReasonOnly().takeover(s), [True] * 3)
    gate = Gate(tau=1.0, lam=2.0, window=2)
    guided = make_policy("guided", gate=gate)  # no budget: the gate alone
    hist = [[1.0, 1.0, 5.0], [1.0, 1.0, 1.0], [0.5, 0.5]]
    got = guided.takeover(step(3, score=[5.0, 2.5, 1.5], history=hist, rows=3))
    # row 0: mean(1, 5) = 3, 5 > 6? no. row 1: mean 1, 2.5 > 2 yes. row 2: mean .5, 1.5 > 1 and > tau yes.
    np.testing.assert_array_equal(got, [False, True, True])
    assert [gate_fires(h, v, gate) for h, v in zip(hist, [5.0, 2.5, 1.5])] == [False, True, True]
    # budget 0.1 of a 10-token limit allows ceil(1) = 1 takeover in all: row 2 already has one
    got = make_policy("guided", gate=gate, budget=0.1).takeover(
        step(3, [5.0, 2.5, 1.5], history=hist, taken=[0, 0, 1], rows=3, limit=10))
    np.testing.assert_array_equal(got, [False, True, False])
    eg = EntropyGated(threshold=1.0, budget=0.5, max_takeovers=1)
    np.testing.assert_array_equal(eg.takeover(step(5, entropy=[0.5, 1.5, 2.0], taken=[0, 0, 1], rows=3)),
                                  [False, True, False])
    np.testing.assert_array_equal(EntropyGated(threshold=1.0).takeover(step(5, entropy=[0.5, 1.5], taken=[0, 99],
                                                                            rows=2)), [False, True])
    early = EarlyOnly(rate=0.1)  # ceil(0.1 · 25) = 3 tokens
    assert [bool(early.takeover(step(t, limit=25))[0]) for t in range(5)] == [True, True, True, False, False]
    forced = Forced({2: 17, 4: "reason"})
    assert [forced.forced_token(t) for t in range(5)] == [None, None, 17, None, None]
    assert [bool(forced.takeover(step(t))[0]) for t in range(5)] == [False, False, False, False, True]


def test_random_positions_are_reproducible_and_near_the_rate() -> None:
    def draws(policy, n=4000, rows=2):
        return np.stack([policy.takeover(step(t, rows=rows)) for t in range(n)])  # (n, rows)

    a, b = draws(RandomPositions(rate=0.2, seed=7)), draws(RandomPositions(rate=0.2, seed=7))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, draws(RandomPositions(rate=0.2, seed=8)))
    assert not np.array_equal(a[:, 0], a[:, 1])  # rows draw independently
    sigma = math.sqrt(0.2 * 0.8 / a.size)
    assert abs(a.mean() - 0.2) < 4 * sigma
    # a draw depends on (seed, row, t) only, so a run that starts mid-way (a branch) sees the same draws
    late = np.stack([RandomPositions(rate=0.2, seed=7).takeover(step(t, rows=2)) for t in range(3000, 3010)])
    np.testing.assert_array_equal(late, a[3000:3010])
    assert not draws(RandomPositions(rate=0.0), 200).any() and draws(RandomPositions(rate=1.0), 200).all()


def test_bad_parameters_name_the_value() -> None:
    for make, match in [
        (lambda: Guided(budget=1.01), "budget"), (lambda: Guided(budget=-0.5), "budget"),
        (lambda: EntropyGated(budget=2), "budget"), (lambda: EntropyGated(threshold=-1.0), "threshold"),
        (lambda: RandomPositions(rate=1.5), "rate"), (lambda: EarlyOnly(rate=float("nan")), "rate"),
        (lambda: Forced({-1: 3}), "non-negative"), (lambda: Forced({1: "base"}), "token id or 'reason'"),
        (lambda: Guided(score="kll"), "kll"), (lambda: Guided(score="delta_logp"), "delta_logp"),
        (lambda: policy_from_record({"name": "nope"}), "guided"),
    ]:
        with pytest.raises(core.InvalidInputError, match=match):
            make()


ALL = [BaseOnly(), ReasonOnly(), Guided(tau=1.5, lam=1.2, window=8, budget=0.05, score="jsd", max_takeovers=4),
       EntropyGated(threshold=2.0, budget=0.2, max_takeovers=None), RandomPositions(rate=0.25, seed=3),
       EarlyOnly(rate=0.25), Forced({3: 42, 7: "reason"})]


@pytest.mark.parametrize("policy", ALL, ids=lambda p: p.name)
def test_records_round_trip(policy) -> None:
    record = policy.record()
    assert record["name"] == policy.name and POLICIES[policy.name] is type(policy)
    import json

    rebuilt = policy_from_record(json.loads(json.dumps(record)))  # as read back from a stored trace
    assert type(rebuilt) is type(policy) and rebuilt == policy and rebuilt.record() == record


# -- on real runs -----------------------------------------------------------------------------------


def replay_budgeted(trace: core.Trace, wants, budget: float | None, max_takeovers: int | None, limit: int) -> None:
    """Check that trace.source is "reason" exactly where `wants(t)` and the budget allow it."""
    taken = 0
    for t in range(len(trace)):
        allowed = taken + 1 <= cap(budget, limit) and (max_takeovers is None or taken < max_takeovers)
        expect = bool(wants(t)) and allowed
        assert (trace.source[t] == "reason") == expect, f"position {t}"
        taken += expect
    assert trace.n_takeovers == taken


def test_guided_fires_where_the_gate_says_on_the_realised_history(qwen_pair) -> None:
    base = core.generate(qwen_pair, PROMPTS, max_new_tokens=40)
    gate = calibrate_gate([t.metrics["cross_entropy"] for t in base], ratio=0.3, window=4)
    fired = 0
    for budget, max_takeovers in [(None, None), (0.05, None), (1.0, 3)]:
        policy = make_policy("guided", gate=gate, budget=budget, max_takeovers=max_takeovers)
        for trace in core.generate(qwen_pair, PROMPTS, policy, max_new_tokens=40):
            s = score_values(trace.metrics, "cross_entropy")  # the realised scores, as the trace records them
            replay_budgeted(trace, lambda t: gate_fires(list(s[:t]), float(s[t]), gate), budget, max_takeovers, 40)
            assert trace.meta["policy"] == policy.record()
            fired += int((trace.source == "reason").sum())
    assert fired >= 4


def test_guided_budget_binds(qwen_pair) -> None:
    """With an always-firing gate the budget's ceil(0.2 · 20) = 4 takeovers are the first 4 tokens; with no
    budget (the default, as in the paper) every token is taken over."""
    policy = Guided(tau=-1.0, lam=0.0, window=2, budget=0.2)
    trace = core.generate(qwen_pair, PROMPT, policy, max_new_tokens=20)
    assert list(trace.source) == ["reason"] * 4 + ["base"] * 16 and trace.n_takeovers == 4
    uncapped = core.generate(qwen_pair, PROMPT, Guided(tau=-1.0, lam=0.0, window=2), max_new_tokens=20)
    assert uncapped.n_takeovers == 20


def test_entropy_gated_fires_on_base_entropy_within_budget(qwen_pair) -> None:
    policy = EntropyGated(threshold=1.8, budget=0.3)
    traces = core.generate(qwen_pair, PROMPTS, policy, max_new_tokens=32)
    for trace in traces:
        h = trace.metrics["entropy_base"]
        assert np.abs(h - policy.threshold).min() > 1e-4  # no decision rests on float rounding
        replay_budgeted(trace, lambda t: h[t] > policy.threshold, 0.3, None, 32)
    assert sum(int((t.source == "reason").sum()) for t in traces) >= 3
    assert any(((t.metrics["entropy_base"] > 1.8) & (t.source == "base")).any() for t in traces)  # budget bit


def test_random_positions_on_a_run(qwen_pair) -> None:
    policy = RandomPositions(rate=0.3, seed=5)
    runs = [core.generate(qwen_pair, PROMPT, policy, max_new_tokens=48) for _ in range(2)]
    assert len(runs[0]) == 48
    np.testing.assert_array_equal(runs[0].token_ids, runs[1].token_ids)
    ids = [row_identity(PROMPT, 0)]  # greedy: sample 0
    expect = np.array([RandomPositions(rate=0.3, seed=5).takeover(step(t, ids=ids))[0] for t in range(48)])
    np.testing.assert_array_equal(runs[0].source == "reason", expect)
    other = core.generate(qwen_pair, PROMPT, RandomPositions(rate=0.3, seed=6), max_new_tokens=48)
    assert not np.array_equal(other.source, runs[0].source)


def test_random_positions_do_not_depend_on_the_batch(qwen_pair) -> None:
    """A row's takeover positions follow its prompt and sample, not its place in a batch: a problem run
    alone, second in a batch, or in a batch of another order gets the same positions (and tokens)."""
    policy = RandomPositions(rate=0.3, seed=5)
    alone = core.generate(qwen_pair, PROMPTS[1], policy, max_new_tokens=24)
    batch = core.generate(qwen_pair, PROMPTS, policy, max_new_tokens=24)
    swapped = core.generate(qwen_pair, PROMPTS[::-1], policy, max_new_tokens=24)
    assert (alone.source == "reason").any()
    np.testing.assert_array_equal(batch[1].source, alone.source)
    np.testing.assert_array_equal(swapped[0].source, alone.source)
    np.testing.assert_array_equal(swapped[1].source, batch[0].source)
    np.testing.assert_array_equal(batch[1].token_ids, alone.token_ids)
    # two samples of one problem draw differently
    pair_of_samples = core.generate(qwen_pair, PROMPT, policy, max_new_tokens=24, samples=2, temperature=0.7)
    assert not np.array_equal(pair_of_samples[0].source, pair_of_samples[1].source)


def test_early_only_forced_and_reason_only(qwen_pair) -> None:
    early = core.generate(qwen_pair, PROMPT, EarlyOnly(rate=0.25), max_new_tokens=18)  # ceil(4.5) = 5
    assert list(early.source) == ["reason"] * 5 + ["base"] * 13
    forced = core.generate(qwen_pair, PROMPT, Forced({1: 42, 4: "reason"}), max_new_tokens=8)
    assert forced.token_ids[1] == 42 and forced.source[1] == "forced" and forced.source[4] == "reason"
    assert list(np.delete(forced.source, [1, 4])) == ["base"] * 6
    ids = forced.token_ids.tolist()
    with torch.no_grad():
        logits = qwen_pair.reason(torch.tensor([forced.prompt_ids["reason"] + ids[:4]])).logits[0, -1]
    assert ids[4] == int(logits[: qwen_pair.vocab_size].argmax())
    reason = core.generate(qwen_pair, PROMPT, ReasonOnly(), max_new_tokens=10)
    assert len(reason) == 10 and (reason.source == "reason").all()
    # the reasoner decoding greedily from its own prompt alone gives the same text
    seq = list(reason.prompt_ids["reason"])
    for _ in range(10):
        with torch.no_grad():
            seq.append(int(qwen_pair.reason(torch.tensor([seq])).logits[0, -1, : qwen_pair.vocab_size].argmax()))
    assert seq[-10:] == reason.token_ids.tolist()
    for trace, policy in [(early, EarlyOnly(rate=0.25)), (forced, Forced({1: 42, 4: "reason"})),
                          (reason, ReasonOnly())]:
        assert policy_from_record(trace.meta["policy"]) == policy


def test_a_policy_that_did_nothing_says_so(qwen_pair) -> None:
    """EntropyGated above every base entropy makes no takeover, and `diagnose` names the threshold (issue 11)."""
    traces = core.generate(qwen_pair, PROMPTS, EntropyGated(threshold=50.0), max_new_tokens=8)
    assert all(t.n_takeovers == 0 for t in traces)
    notice = EntropyGated(threshold=50.0).diagnose(traces)
    assert notice is not None and "threshold=50" in notice and "0 takeovers in 2 trace(s)" in notice
    low = EntropyGated(threshold=0.0)
    assert low.diagnose(core.generate(qwen_pair, PROMPTS, low, max_new_tokens=8)) is None
    assert BaseOnly().diagnose(traces) is None  # doing nothing is BaseOnly's job


def test_skip_first_keeps_the_gates_off_the_first_positions(qwen_pair) -> None:
    """skip_first=k: no takeover before position k (an always-firing gate takes every later one), through
    the decoding engine and its verify-ahead blocks; recorded in the policy only when it is not 0."""
    for policy in (Guided(tau=-1.0, lam=0.0, window=2, skip_first=3), EntropyGated(threshold=0.0, skip_first=3)):
        trace = core.generate(qwen_pair, PROMPT, policy, max_new_tokens=12)
        assert list(trace.source) == ["base"] * 3 + ["reason"] * 9
        assert trace.meta["policy"]["params"]["skip_first"] == 3
        assert policy_from_record(policy.record()).skip_first == 3
    assert "skip_first" not in Guided(tau=0.0).record()["params"]  # 0: older traces' request keys stay the same
    g = Guided(tau=-1.0, lam=0.0, window=2, skip_first=2)
    assert not g.takeover(step(1, score=[5.0])).any() and g.takeover(step(2, score=[5.0])).all()
    with pytest.raises(core.InvalidInputError, match="skip_first"):
        Guided(tau=0.0, skip_first=-1)
