"""Tests for core.analysis: each analysis against hand-computed values and brute-force references."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pandas as pd
import pytest
from fakes import fake_decode, make_trace
from hypothesis import given, settings
from hypothesis import strategies as st

from core.analysis import tables as A
from core.errors import ForkpointError, InvalidInputError


def with_metrics(trace, **arrays):
    """A copy of `trace` with some metric arrays replaced."""
    metrics = {**trace.metrics, **{k: np.asarray(v) for k, v in arrays.items()}}
    return dataclasses.replace(trace, metrics=metrics)


def brute_gini(v):
    v = np.clip(np.asarray(v, dtype=float), 0, None)
    n = v.size
    return sum(abs(a - b) for a, b in itertools.product(v, v)) / (2 * n * n * v.mean())


def brute_auroc(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


# -- sparsity -----------------------------------------------------------------------------------


def test_gini_hand_values():
    assert A.gini([0, 0, 0, 1]) == pytest.approx(0.75)  # population definition: (n-1)/n at most
    assert A.gini([1, 1, 1, 1]) == pytest.approx(0.0)
    assert A.gini([1, 2, 3, 4]) == pytest.approx(0.25)  # sum|xi-xj| = 20; 20 / (2*16*2.5)
    assert A.gini([-5, 0, 0, 1]) == pytest.approx(0.75)  # negatives clipped to 0
    assert A.gini([0, 0]) == 0.0
    assert np.isnan(A.gini([]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=30).filter(lambda v: sum(v) > 1e-6))
def test_gini_matches_pairwise_definition(values):
    assert A.gini(values) == pytest.approx(brute_gini(values), abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=30).filter(lambda v: sum(v) > 1e-6))
def test_gini_is_one_minus_twice_lorenz_area(values):
    x, y = A.lorenz_points(values)
    area = float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))
    assert A.gini(values) == pytest.approx(1 - 2 * area, abs=1e-9)


def test_lorenz_points_hand_values():
    x, y = A.lorenz_points([4, 1, 3, 2])
    np.testing.assert_allclose(x, [0, 0.25, 0.5, 0.75, 1])
    np.testing.assert_allclose(y, [0, 0.1, 0.3, 0.6, 1])


def test_mass_fraction_hand_values():
    assert A.mass_fraction_value([0, 0, 0, 1], 0.8) == 0.25
    assert A.mass_fraction_value([1, 1, 1, 1], 0.8) == 1.0
    assert A.mass_fraction_value([1, 1, 1, 1], 0.75) == 0.75  # exactly 3 of 4 reach 75%
    assert A.mass_fraction_value([4, 3, 2, 1], 0.7) == 0.5
    with pytest.raises(InvalidInputError):
        A.mass_fraction_value([1, 2], 0.0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=30).filter(any), st.sampled_from([0.1, 0.5, 0.8, 0.95, 1.0]))
def test_mass_fraction_brute_force(values, mass):
    v = sorted(values, reverse=True)
    k = next(k for k in range(1, len(v) + 1) if sum(v[:k]) >= mass * sum(v) - 1e-9)
    assert A.mass_fraction_value(values, mass) == pytest.approx(k / len(v))


def test_tables_per_trace_and_pooled():
    a = with_metrics(make_trace(4, 1), cross_entropy=[0.0, 0, 0, 1])
    b = with_metrics(make_trace(4, 2), cross_entropy=[1.0, 1, 1, 1])
    g = A.gini_table([a, b])
    assert list(g["trace"]) == [a.key, b.key, "pooled"]
    np.testing.assert_allclose(g["gini"], [0.75, 0.0, A.gini([0, 0, 0, 1, 1, 1, 1, 1])])
    m = A.mass_fraction([a, b], mass=0.8)
    np.testing.assert_allclose(m["fraction"], [0.25, 1.0, 4 / 8])  # pooled: 5 units, 4 needed
    lz = A.lorenz([a, b], pooled=False)
    assert set(lz["trace"]) == {a.key, b.key} and len(lz) == 10
    big = A.lorenz(make_trace(3000, 3), max_points=101)
    assert len(big) <= 202 and big["x"].iloc[0] == 0 and big["x"].iloc[-1] == 1


# -- position -----------------------------------------------------------------------------------


def test_position_density_hand_case():
    ce = np.zeros(100)
    ce[50] = 9.0
    a = with_metrics(make_trace(100, 1), cross_entropy=ce)
    ce2 = np.zeros(100)
    ce2[0] = 9.0
    b = with_metrics(make_trace(100, 2), cross_entropy=ce2)
    df = A.position_density([a, b], top=0.01, bins=20)
    assert df["count"].tolist() == [1] + [0] * 9 + [1] + [0] * 9  # u = 0 and u = 0.5
    assert df["density"].iloc[0] == pytest.approx(10.0)  # half the mass in a bin of width 1/20
    assert (df["uniform"] == 1.0).all()
    assert df.attrs["median_u"] == pytest.approx(0.25) and df.attrs["n"] == 2
    assert df.attrs["peak_u"] == pytest.approx(0.025)  # a tie between u = 0 and u = 0.5: the earlier bin's centre
    c = with_metrics(make_trace(100, 3), cross_entropy=ce)  # a second spike at u = 0.5
    assert A.position_density([a, b, c], top=0.01, bins=20).attrs["peak_u"] == pytest.approx(0.525)


@pytest.mark.parametrize("bins", [1, 7, 20])
def test_position_density_integrates_to_one(bins):
    traces = [make_trace(120, s) for s in range(4)]
    df = A.position_density(traces, top=0.1, bins=bins)
    assert float((df["density"] * (df["bin_right"] - df["bin_left"])).sum()) == pytest.approx(1.0)
    assert df["count"].sum() == 4 * 12


# -- uncertainty --------------------------------------------------------------------------------


def test_entropy_iou_identical_rankings_is_one():
    traces = [make_trace(60, s) for s in range(3)]
    df = A.entropy_iou(traces, score="entropy_base")
    assert (df["iou"] == 1.0).all()
    rescaled = [with_metrics(t, cross_entropy=2 * t.metrics["entropy_base"] + 1) for t in traces]
    assert (A.entropy_iou(rescaled)["iou"] == 1.0).all()  # same ranking, different values


def test_entropy_iou_hand_case():
    a = with_metrics(make_trace(4, 1), cross_entropy=[9.0, 8, 0, 0], entropy_base=[0.0, 9, 8, 0])
    b = with_metrics(make_trace(4, 2), cross_entropy=[0.0, 0, 8, 9], entropy_base=[0.0, 0, 8, 9])
    df = A.entropy_iou([a, b], ps=(0.5,))
    # a: {0,1} vs {1,2} -> 1 of 3; b: {2,3} vs {2,3} -> 2 of 2; pooled (1+2)/(3+2)
    assert df["iou"].iloc[0] == pytest.approx(3 / 5)
    assert df["n"].iloc[0] == 4


# -- enrichment ---------------------------------------------------------------------------------


def test_enrichment_hand_case():
    t = make_trace(10, 1)
    tags = ["plan", "plan"] + ["execute"] * 8
    source = np.array(["reason", "base", "base", "base", "base", "forced", "base", "base", "base", "base"], dtype=object)
    ce = np.zeros(10)
    ce[0] = 5.0
    h = np.zeros(10)
    h[9] = 5.0
    t = dataclasses.replace(with_metrics(t, cross_entropy=ce, entropy_base=h), source=source).annotate(tags=tags)
    df = A.enrichment([t], top=0.1).set_index(["set", "category"])
    assert df.loc[("all", "plan"), "share"] == pytest.approx(0.2)
    assert df.loc[("top_score", "plan"), "share"] == 1.0
    assert df.loc[("top_score", "plan"), "enrichment"] == pytest.approx(5.0)
    assert df.loc[("top_entropy", "plan"), "enrichment"] == 0.0
    assert df.loc[("taken_over", "plan"), "enrichment"] == pytest.approx(5.0)  # 1 of {0}: the forced 5 is no takeover
    # the pooled "planning" row counts every non-execute tag: here the same tokens as "plan"
    assert df.loc[("top_score", "planning"), "enrichment"] == pytest.approx(5.0)
    assert df.loc[("taken_over", "execute"), "n"] == 0 and df.loc[("taken_over", "execute"), "size"] == 1


def test_enrichment_rejects_wrong_length_tags():
    t = make_trace(5, 1).annotate(tags=["x"] * 4)
    with pytest.raises(InvalidInputError, match="4 tags for 5 tokens"):
        A.enrichment([t])


# -- failure prediction -------------------------------------------------------------------------


def test_auroc_hand_values():
    assert A.auroc([1, 2, 3, 4], [0, 0, 1, 1]) == 1.0
    assert A.auroc([1, 2, 3, 4], [1, 1, 0, 0]) == 0.0
    assert A.auroc([1, 1], [1, 0]) == 0.5
    assert A.auroc([1, 2, 2, 3], [0, 1, 0, 1]) == pytest.approx(0.875)  # pairs: 3>1,3>2,2=2 (.5),2>1
    assert np.isnan(A.auroc([1, 2], [1, 1]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=2, max_size=40))
def test_auroc_matches_pairwise_count(pairs):
    scores, labels = zip(*pairs)
    if all(labels) or not any(labels):
        assert np.isnan(A.auroc(scores, labels))
        return
    assert A.auroc(scores, labels) == pytest.approx(brute_auroc(scores, labels))
    fpr, tpr, th = A.roc_points(scores, labels)
    area = float(np.sum((fpr[1:] - fpr[:-1]) * (tpr[1:] + tpr[:-1]) / 2))
    assert area == pytest.approx(A.auroc(scores, labels))
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert np.all(np.diff(th) < 0)


def test_trace_stat():
    v = np.arange(150.0)
    assert A.trace_stat(v, "top100_mean") == pytest.approx(99.5)  # mean of 50..149
    assert A.trace_stat(v[:10], "top100_mean") == pytest.approx(4.5)  # fewer than 100: all
    assert A.trace_stat(v, "max") == 149.0
    assert A.trace_stat(v, "top3_mean") == pytest.approx(148.0)
    assert np.isnan(A.trace_stat(np.zeros(0), "max"))
    for bad in ("top0_mean", "median", "top_mean"):
        with pytest.raises(InvalidInputError, match="top<k>_mean"):
            A.trace_stat(v, bad)


def _labelled(values, correct, seed):
    t = make_trace(len(values), seed, meta={"correct": correct})
    return with_metrics(t, cross_entropy=np.asarray(values, float), entropy_base=-np.asarray(values, float))


def test_failure_auroc_and_roc_curve():
    traces = [
        _labelled([5, 6], False, 1),  # wrong, high score
        _labelled([4, 1], False, 2),
        _labelled([1, 2], True, 3),
        _labelled([3, 0], True, 4),
        _labelled([9, 9], None, 5),  # unknown correctness: excluded
    ]
    df = A.failure_auroc(traces, stat="max").set_index("signal")
    assert df.loc["cross_entropy", "auroc"] == 1.0  # wrong maxima 6, 4 vs right 2, 3
    # entropy = -values: maxima are -min: wrong -5, -1 vs right -1, 0 -> only the -1 = -1 tie scores (0.5 / 4)
    assert df.loc["entropy_base", "auroc"] == pytest.approx(0.125)
    assert (df["n_pos"] == 2).all() and (df["n_neg"] == 2).all() and (df["note"] == "").all()
    roc = A.roc_curve(traces, stat="max")
    assert set(roc["signal"]) == {"cross_entropy", "entropy_base"}
    ce = roc[roc["signal"] == "cross_entropy"]
    assert ce[["fpr", "tpr"]].iloc[-1].tolist() == [1.0, 1.0]


def test_failure_auroc_one_class_is_nan_with_note():
    traces = [_labelled([1, 2], True, 1), _labelled([3, 4], True, 2)]
    df = A.failure_auroc(traces, score="entropy_base")
    assert len(df) == 1 and np.isnan(df["auroc"].iloc[0])
    assert "0 wrong and 2 right" in df["note"].iloc[0]
    assert A.roc_curve(traces).empty


# -- rank of the reasoner's choice --------------------------------------------------------------


def test_reason_rank_hand_case():
    t = with_metrics(make_trace(5, 1), reason_top_rank_in_base=np.array([0, 0, 1, 5, 12]))
    df = A.reason_rank([t], at="all")
    assert df["count"].tolist() == [2, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1]
    assert df["label"].iloc[-1] == ">=10"
    assert df["cum_share"].iloc[0] == pytest.approx(0.4)  # within top-1
    assert df["cum_share"].iloc[4] == pytest.approx(0.6)  # within top-5
    spiky = t.annotate(spikes={"rule": {}, "positions": [3, 4]})
    assert A.reason_rank([spiky], at="spikes")["count"].sum() == 2
    within = A.reason_rank_within([spiky]).set_index(["at", "k"])
    assert within.loc[("all", 5), "share"] == pytest.approx(0.6)
    assert within.loc[("spikes", 10), "share"] == pytest.approx(0.5)
    with pytest.raises(InvalidInputError, match="all, spikes"):
        A.reason_rank([t], at="some")


# -- decision pairs -----------------------------------------------------------------------------


def _pair_trace():
    t = make_trace(3, 1, k=3)
    ids_b = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    probs_b = np.array([[0.5, 0.3, 0.1], [0.2, 0.6, 0.1], [0.4, 0.3, 0.2]], dtype=np.float32)
    ids_r = np.array([[2, 1, 9], [10, 11, 4], [7, 8, 9]])
    probs_r = np.array([[0.7, 0.2, 0.05], [0.5, 0.3, 0.1], [0.9, 0.05, 0.01]], dtype=np.float32)
    t = dataclasses.replace(t, topk={"base": (ids_b, probs_b), "reason": (ids_r, probs_r)})
    return with_metrics(t, cross_entropy=[3.0, 2.0, 1.0]).annotate(spikes={"rule": {}, "positions": [0, 1]})


def test_decision_pairs_hand_case():
    t = _pair_trace()
    df = A.decision_pairs([t], tokenizer_decode=lambda ids: fake_decode(ids[0]))
    assert df["pos"].tolist() == [0, 1]
    r0, r1 = df.iloc[0], df.iloc[1]
    assert (r0.base_id, r0.reason_id) == (1, 2)
    assert (r0.p_base_base, r0.p_base_reason, r0.p_reason_base, r0.p_reason_reason) == pytest.approx((0.5, 0.3, 0.2, 0.7))
    assert (r1.base_id, r1.reason_id) == (5, 10)  # argmax of the probabilities, not the first column
    assert np.isnan(r1.p_base_reason) and np.isnan(r1.p_reason_base)
    assert r0.prefix == "" and r1.prefix == t.tokens[0]
    assert r1.base_text == fake_decode(5) and r0.score == 3.0 and r0.score_name == "cross_entropy"
    unannotated = dataclasses.replace(t, annotations={})
    assert A.decision_pairs([unannotated])["pos"].tolist() == [0]  # top 1% of 3 tokens
    assert A.decision_pairs([unannotated])["base_text"].iloc[0] in (None, t.tokens[0])


def test_write_decision_pairs_jsonl(tmp_path):
    df = A.decision_pairs([_pair_trace()])
    path = str(tmp_path / "pairs.jsonl")
    A.write_decision_pairs_jsonl(df, path)
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert len(rows) == 2 and rows[1]["p_base_reason"] is None and rows[0]["base_id"] == 1
    assert set(rows[0]) == set(A.DECISION_COLUMNS)
    with pytest.raises(ForkpointError, match="exists"):
        A.write_decision_pairs_jsonl(df, path)
    A.write_decision_pairs_jsonl(df.head(1), path, overwrite=True)
    assert len(open(path, encoding="utf-8").readlines()) == 1


# -- segments and arguments ---------------------------------------------------------------------


def test_segment_restricts_positions():
    t = with_metrics(make_trace(6, 1), cross_entropy=[0.0, 0, 0, 0, 1, 1])
    seg = t.annotate(segments=["think"] * 4 + ["answer"] * 2)
    g = A.gini_table([seg], segment="think")
    assert g["n"].iloc[0] == 4 and g["gini"].iloc[0] == 0.0
    assert A.gini_table([seg], segment="answer")["gini"].iloc[0] == 0.0
    assert A.gini_table([t], segment="answer")["n"].iloc[0] == 6  # no segments layer: kept whole
    dp = A.decision_pairs([seg], segment="answer")
    assert dp["pos"].tolist() == [4]  # original positions, not positions within the segment
    with pytest.raises(InvalidInputError, match="think, answer"):
        A.gini_table([t], segment="thought")


def test_unknown_score_lists_choices():
    with pytest.raises(InvalidInputError, match="cross_entropy"):
        A.lorenz([make_trace(5, 1)], score="kll")


def test_accepts_single_trace():
    t = make_trace(20, 1)
    pd.testing.assert_frame_equal(A.gini_table(t), A.gini_table([t]))


# -- the thinking-template artefact ------------------------------------------------------------------


def test_first_token_artifact():
    t = make_trace(8, seed=1)
    ce = np.array([1.0, 2.0, 0.5, 3.0, 0.1, 0.2, 0.3, 0.4])
    assert not A.first_token_artifact(with_metrics(t, cross_entropy=ce))
    spiky = with_metrics(t, cross_entropy=np.r_[12.3, ce[1:]])
    assert A.first_token_artifact(spiky)
    assert not A.first_token_artifact(with_metrics(t, cross_entropy=np.r_[3.0, ce[1:]]))  # a tie is no artefact
    assert A.first_token_artifact(with_metrics(t, cross_entropy=np.r_[5.0, np.full(7, np.nan)]))
    assert not A.first_token_artifact(t.prefix(1) if hasattr(t, "prefix") else t.head(1))
    assert A.first_token_artifact(with_metrics(t, entropy_base=np.r_[9.0, np.zeros(7)]), score="entropy_base")
    assert A.first_token_artifact_share([spiky, with_metrics(t, cross_entropy=ce)]) == 0.5
