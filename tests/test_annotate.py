"""Tests for core.annotate: top-p% spikes, the calibrated gate, and their annotations."""

from __future__ import annotations

import dataclasses
import math
from collections import deque

import numpy as np
import pytest
from fakes import make_trace
from hypothesis import given, settings
from hypothesis import strategies as st

from core.annotate.spikes import (
    Gate,
    calibrate_gate,
    gate_fires,
    gate_positions,
    spikes,
    spikes_or_top,
    top_count,
    top_positions,
)
from core.errors import InvalidInputError


def with_metrics(trace, **arrays):
    """A copy of `trace` with some metric arrays replaced."""
    metrics = {**trace.metrics, **{k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}}
    return dataclasses.replace(trace, metrics=metrics)


def reference_gate(scores, tau, lam, window):
    """Independent loop: fire iff s_t > tau and (t == 0 or s_t > lam * mean of the last <= W scores)."""
    out = []
    for t, s in enumerate(scores):
        hist = scores[max(0, t - window) : t]
        if s > tau and (not hist or s > lam * (math.fsum(hist) / len(hist))):
            out.append(t)
    return out


# -- the gate -----------------------------------------------------------------------------------


def test_gate_fires_hand_cases():
    g = Gate(tau=1.0, lam=2.0, window=2)
    assert gate_fires([], 2.0, g)  # t = 0: only the tau test
    assert not gate_fires([], 1.0, g)  # strict: s == tau does not fire
    assert gate_fires([1.0, 3.0], 4.5, g)  # mean 2, 4.5 > 4
    assert not gate_fires([1.0, 3.0], 4.0, g)  # 4 > 4 is false
    assert gate_fires([100.0, 1.0, 1.0], 2.5, g)  # only the last W = 2 count: mean 1
    assert not gate_fires([100.0, 1.0], 2.5, Gate(1.0, 2.0, 3))  # W = 3 sees 100: mean 50.5
    assert not gate_fires([1.0], float("nan"), g)
    assert not gate_fires([float("nan")], 5.0, g)  # a NaN in the window blocks firing
    assert gate_fires(deque([100.0, 1.0, 1.0], maxlen=8), 2.5, g)  # any sequence-like history
    assert gate_fires(np.array([100.0, 1.0, 1.0]), 2.5, g)


def test_gate_validation():
    for bad in [dict(tau=0.0, lam=1.0, window=0), dict(tau=float("nan"), lam=1.0, window=2),
                dict(tau=0.0, lam=float("inf"), window=2), dict(tau=0.0, lam=1.0, window=1.5)]:  # fmt: skip
        with pytest.raises(InvalidInputError):
            Gate(**bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Gate(1.0, 2.0, 3).tau = 2.0  # type: ignore[misc]
    assert Gate(1, 2, 3).to_dict() == {"tau": 1.0, "lam": 2.0, "window": 3}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(-16, 128), min_size=0, max_size=60),
    st.integers(-8, 64),
    st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]),
    st.integers(1, 7),
)
def test_gate_positions_match_loop_reference(ints, tau8, lam, window):
    # multiples of 1/8: every sum is exact, so ties are decided the same way in any summation order
    scores = [i / 8 for i in ints]
    got = gate_positions(np.array(scores), Gate(tau8 / 8, lam, window)).tolist()
    assert got == reference_gate(scores, tau8 / 8, lam, window)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-5, 50, allow_nan=False), min_size=0, max_size=80),
    st.floats(-1, 10),
    st.floats(0, 4),
    st.integers(1, 12),
)
def test_gate_positions_equal_stepwise_gate_fires(scores, tau, lam, window):
    g = Gate(tau, lam, window)
    stepwise = [t for t in range(len(scores)) if gate_fires(scores[:t], scores[t], g)]
    assert gate_positions(np.array(scores), g).tolist() == stepwise


def test_gate_positions_nan_blocks_window():
    s = np.array([5.0, np.nan, 5.0, 5.0, 5.0])
    # W = 1: t=1 NaN never fires, t=2 has NaN in its window, t=3 and t=4 compare with 5 -> 5 > 5 false
    assert gate_positions(s, Gate(1.0, 0.5, 1)).tolist() == [0, 3, 4]
    assert gate_positions(np.zeros(0), Gate(1.0, 1.0, 2)).tolist() == []


def test_calibrate_gate_hand_values():
    a, b = np.arange(1.0, 6.0), np.arange(6.0, 11.0)  # pooled 1..10
    g = calibrate_gate([a, b], ratio=0.2, window=8)
    assert g.tau == 8.2  # linear quantile at 0.8: 1 + 0.8 * 9
    assert g.lam == 1.72727  # mean of {9, 10} over mean of 1..10 (9.5 / 5.5), to GATE_DIGITS = 6 digits
    assert g.window == 8


def test_fitted_gate_is_rounded_so_keys_agree():
    """tau and lam go into the policy record (the key): fits from scores that differ in float rounding, as
    two drivers' do, give the same numbers once rounded to GATE_DIGITS significant digits."""
    from core.annotate.spikes import GATE_DIGITS, gate_value

    assert GATE_DIGITS == 6 and gate_value(0.023175123613) == gate_value(0.023175123334) == 0.0231751
    assert gate_value(19.832482165094692) == 19.8325 and gate_value(1234567.0) == 1234570.0
    rng = np.random.default_rng(0)
    scores = [rng.gamma(0.5, 2.0, size=400) for _ in range(3)]
    noisy = [s * (1 + 1e-12 * rng.standard_normal(s.size)) for s in scores]
    g, h = calibrate_gate(scores, 0.05, 16), calibrate_gate(noisy, 0.05, 16)
    assert (g.tau, g.lam) == (h.tau, h.lam) and g.tau == gate_value(g.tau)


def test_calibrate_gate_against_numpy():
    rng = np.random.default_rng(3)
    parts = [rng.gamma(0.5, 2.0, size=n) for n in (50, 120, 7)]
    parts[1][3] = np.nan  # dropped
    pooled = np.concatenate(parts)
    pooled = pooled[~np.isnan(pooled)]
    g = calibrate_gate(parts, ratio=0.05, window=4)
    tau = np.quantile(pooled, 0.95)
    assert g.tau == pytest.approx(tau, rel=5e-6)  # rounded to 6 significant digits
    assert g.lam == pytest.approx(pooled[pooled > tau].mean() / pooled.mean(), rel=5e-6)
    # about r of the calibration tokens pass the absolute threshold
    assert np.mean(pooled > g.tau) == pytest.approx(0.05, abs=1.5 / pooled.size)


@pytest.mark.parametrize(
    "parts, ratio",
    [([np.ones(10)], 0.1), ([np.arange(5.0)], 0.0), ([np.arange(5.0)], 1.0), ([], 0.1), ([-np.arange(1.0, 9.0)], 0.2)],
)
def test_calibrate_gate_rejects(parts, ratio):
    with pytest.raises(InvalidInputError):
        calibrate_gate(parts, ratio=ratio, window=4)


# -- top-p% -------------------------------------------------------------------------------------


def test_top_count():
    assert top_count(0.07, 100) == 7  # not 8: 0.07 * 100 is 7.000000000000001 in floats
    assert top_count(0.01, 50) == 1  # ceil(0.5)
    assert top_count(0.01, 1) == 1
    assert top_count(0.01, 0) == 0
    assert top_count(1.0, 5) == 5
    assert top_count(0.5, 3) == 2
    for bad in (0, 0.0, -0.1, 1.5, True, "0.1"):
        with pytest.raises(InvalidInputError, match="top must be"):
            top_count(bad, 10)  # type: ignore[arg-type]


def test_top_positions_ties_and_nans():
    assert top_positions(np.array([1.0, 3.0, 3.0, 2.0]), 0.5).tolist() == [1, 2]
    assert top_positions(np.array([3.0, 3.0, 3.0]), 0.34).tolist() == [0, 1]  # ties: earlier wins
    assert top_positions(np.array([np.nan, 1.0]), 1.0).tolist() == [1]
    assert top_positions(np.array([5.0, 1.0, 9.0]), 0.01).tolist() == [2]  # at least one


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=50), st.floats(0.001, 1.0))
def test_top_positions_brute_force(ints, top):
    v = np.array(ints, dtype=float)
    got = top_positions(v, top).tolist()
    # brute force: sort positions by (-value, position) and take the first ceil(top * n)
    expected = sorted(sorted(range(len(v)), key=lambda i: (-v[i], i))[: top_count(top, len(v))])
    assert got == expected


# -- spikes as annotations ----------------------------------------------------------------------


def test_spikes_per_trace_records_rule_and_keeps_original():
    t = with_metrics(make_trace(10, 1), cross_entropy=[0, 9, 1, 1, 8, 0, 0, 7, 0, 0])
    out = spikes(t, top=0.2)
    assert out.annotations["spikes"] == {"rule": {"score": "cross_entropy", "top": 0.2, "per": "trace", "floor": 0.01},
                                         "positions": [1, 4]}
    assert "spikes" not in t.annotations
    assert spikes(t).annotations["spikes"]["positions"] == [1]  # default top 1% -> 1 token
    assert spikes(t).annotations["spikes"]["rule"]["top"] == 0.01
    assert all(isinstance(p, int) for p in out.annotations["spikes"]["positions"])


def test_spikes_delta_logp_uses_negative():
    t = with_metrics(make_trace(4, 2), delta_logp=[0.5, -3.0, 2.0, -1.0])
    assert spikes(t, score="delta_logp", top=0.25).annotations["spikes"]["positions"] == [1]


def test_spikes_per_dataset_pools():
    a = with_metrics(make_trace(4, 1), cross_entropy=[1, 2, 3, 4])
    b = with_metrics(make_trace(6, 2), cross_entropy=[9, 0, 0, 8, 0, 4])
    out = spikes([a, b], top=0.3, per="dataset")  # ceil(0.3 * 10) = 3 of 10: 9, 8, then 4 (tie: a first)
    assert isinstance(out, list)
    assert [o.annotations["spikes"]["positions"] for o in out] == [[3], [0, 3]]
    assert out[0].annotations["spikes"]["rule"]["per"] == "dataset"
    per_trace = spikes([a, b], top=0.3)
    assert [o.annotations["spikes"]["positions"] for o in per_trace] == [[2, 3], [0, 3]]


def test_spikes_gate_matches_gate_positions():
    t = make_trace(80, 5)
    g = Gate(tau=float(np.quantile(t.metrics["cross_entropy"], 0.8)), lam=1.2, window=4)
    out = spikes(t, gate=g)
    assert out.annotations["spikes"]["rule"] == {"score": "cross_entropy", "gate": {"tau": g.tau, "lam": 1.2, "window": 4}}
    assert out.annotations["spikes"]["positions"] == gate_positions(t.metrics["cross_entropy"], g).tolist()
    assert spikes_or_top(out).tolist() == out.annotations["spikes"]["positions"]


def test_spike_positions_fallback():
    t = with_metrics(make_trace(5, 3), cross_entropy=[0, 0, 5, 0, 0])
    assert spikes_or_top(t).tolist() == [2]
    # the fallback is the rule `spikes` applies: no ~0 score is a spike, whatever `top` asks for
    assert spikes_or_top(t, top=0.6).tolist() == [2] == spikes(t, top=0.6).annotations["spikes"]["positions"]
    flat = with_metrics(make_trace(5, 3), cross_entropy=[0, 0, 0, 0, 0])
    assert spikes_or_top(flat, top=0.5).tolist() == [] == spikes(flat, top=0.5).annotations["spikes"]["positions"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(score="kll"), "cross_entropy"),
        (dict(top=0.0), "top must be"),
        (dict(top=1.5), "top must be"),
        (dict(per="corpus"), "trace, dataset"),
        (dict(top=0.1, gate=Gate(1, 1, 2)), "exactly one"),
        (dict(gate=Gate(1, 1, 2), per="dataset"), "per-trace"),
        (dict(gate=(1, 1, 2)), "Gate"),
    ],
)
def test_spikes_rejects_bad_arguments(kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        spikes(make_trace(10, 0), **kwargs)


def test_top_spikes_never_land_on_near_zero_scores():
    """Top 50% of 10 tokens is 5, but only 3 scores clear the floor: 3 spikes, none on a ~0 score."""
    t = with_metrics(make_trace(10, 1), cross_entropy=[0, 9, 0.001, 0, 8, 0, 0.005, 7, 0, 0])
    out = spikes(t, top=0.5)
    assert out.annotations["spikes"]["positions"] == [1, 4, 7]
    assert spikes(t, top=0.5, floor=-1.0).annotations["spikes"]["positions"] == [1, 2, 4, 6, 7]  # no floor: ~0s too
