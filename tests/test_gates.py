"""Gates on the base alone (top_prob, margin, the learned router), equal-ρ calibration of every gate, and
the gate shoot-out (core.compare_gates): each checked against an independent reading of the stored traces."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from spies import FeedLog

import core
from core.decoding.policies import Margin, TopProb, list_policies, make_policy

PROMPTS = ["What is 2+3?", "Tom has 3 boxes of 4 apples. He gives away 2. How many apples are left?", "x"]


def _top(trace: core.Trace) -> np.ndarray:
    return np.asarray(trace.topk["base"][1], dtype=np.float64)[:, :2]


@pytest.mark.parametrize("name, rule", [
    ("top_prob", lambda top, knob: top[:, 0] < knob),
    ("margin", lambda top, knob: top[:, 0] - top[:, 1] < knob),
])
def test_base_only_gates_fire_exactly_where_their_rule_holds(qwen_pair, name, rule) -> None:
    base = core.generate(qwen_pair, PROMPTS, max_new_tokens=32)
    values = np.concatenate([_top(t)[:, 0] if name == "top_prob" else _top(t)[:, 0] - _top(t)[:, 1] for t in base])
    knob = float(np.quantile(values, 0.3))
    policy = make_policy(name, **{"gamma" if name == "top_prob" else "delta": knob})
    fired = 0
    for trace in core.generate(qwen_pair, PROMPTS, policy, max_new_tokens=32):
        top = _top(trace)  # the realised base probabilities, as the trace records them (filled after the run)
        expect = rule(top, knob)
        assert np.abs((top[:, 0] if name == "top_prob" else top[:, 0] - top[:, 1]) - knob).min() > 1e-5
        np.testing.assert_array_equal(trace.source == "reason", expect)
        fired += int(expect.sum())
        assert trace.meta["policy"] == policy.record()
    assert fired >= 3


@pytest.mark.parametrize("policy", [TopProb(gamma=0.5, max_takeovers=4), Margin(delta=0.3, max_takeovers=4)])
def test_lazy_gates_run_the_reasoner_only_where_they_fire(qwen_pair, monkeypatch, policy) -> None:
    pair = dataclasses.replace(qwen_pair, eos_ids=frozenset())  # run all 24 tokens
    log = FeedLog(pair, monkeypatch)
    trace = core.generate(pair, PROMPTS[1], policy, max_new_tokens=24)
    fired = int((trace.source == "reason").sum())
    assert 0 < fired <= 4
    reason = log.sizes("reason")
    # one prefill, one catch-up forward per position where the gate fired, one final flush of the rest
    assert reason[0] == len(trace.prompt_ids["reason"])
    assert len(reason) - 1 - fired in (0, 1)
    assert sum(reason) == len(trace.prompt_ids["reason"]) + len(trace) - 1  # every token read exactly once
    assert log.sizes("base") == [len(trace.prompt_ids["base"])] + [1] * (len(trace) - 1)
    # the reasoner's metrics of the skipped positions were filled in afterwards, as teacher forcing gives them
    scored = core.score(pair, PROMPTS[1], trace.token_ids.tolist())
    np.testing.assert_allclose(trace.metrics["cross_entropy"], scored.metrics["cross_entropy"], atol=1e-4)


def test_new_gates_are_in_the_registry_for_every_edge() -> None:
    names = {s.name: s for s in list_policies()}
    assert names["top_prob"].lazy and names["margin"].lazy
    assert [p.name for p in names["top_prob"].user_params][:1] == ["gamma"]
    assert [p.name for p in names["margin"].user_params][:1] == ["delta"]
    with pytest.raises(core.InvalidInputError, match="gamma"):
        make_policy("top_prob", gamma=1.5)


WORDS = "apples boxes sum two three four add the of is what how many left".split()


@pytest.fixture(scope="module")
def rollouts(qwen_pair):
    """Base rollouts of two disjoint prompt sets (calibration, held out), sampled."""
    from core.decoding import generate_many
    from core.decoding.policies import BaseOnly

    rng = np.random.default_rng(0)
    prompts = [" ".join(rng.choice(WORDS, 6)) for _ in range(96)]
    pair = dataclasses.replace(qwen_pair, eos_ids=frozenset())  # full-length rollouts: more tokens per prompt
    made = {name: generate_many(pair, ps, BaseOnly(), max_new_tokens=40, temperature=1.0, seed=seed, batch_size=16)
            for name, ps, seed in (("calibration", prompts[:48], 1), ("held_out", prompts[48:], 2))}
    return pair, prompts, made


@pytest.mark.parametrize("name", ["guided", "entropy_gated", "top_prob", "margin", "random_positions", "early_only"])
def test_equal_rho_calibration_hits_the_target_on_held_out_rollouts(rollouts, name) -> None:
    from core.decoding.calibration import build_policy, rollout_rho

    pair, prompts, made = rollouts
    target = 0.1
    policy = build_policy(pair, name, rho=target, rollouts=made["calibration"], max_new_tokens=40)
    assert rollout_rho(policy, made["calibration"]) == pytest.approx(target, rel=0.05)
    # on rollouts it was not fit on, replayed along the base's path, and when it runs (its takeovers change it)
    assert rollout_rho(policy, made["held_out"]) == pytest.approx(target, rel=0.25)
    if name in ("entropy_gated", "top_prob", "margin"):
        n_tokens = sum(len(t) for t in made["held_out"])
        fired = sum(int((np.asarray(policy.signal(t)) < getattr(policy, policy.knob)).sum() if policy.fires_below
                        else (np.asarray(policy.signal(t)) > getattr(policy, policy.knob)).sum())
                    for t in made["held_out"])
        assert rollout_rho(policy, made["held_out"]) == fired / n_tokens  # an independent count
    from core.decoding import generate_many

    run = generate_many(pair, prompts[48:], policy, max_new_tokens=40, temperature=1.0, seed=2, batch_size=16)
    realised = sum(t.n_takeovers for t in run) / sum(len(t) for t in run)
    assert realised == pytest.approx(target, rel=0.35)
