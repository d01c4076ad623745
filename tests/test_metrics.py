"""core.scoring.metrics: every metric against an independent float64 reference, the identities that must hold, and
the decoding entry points (step_metrics + emitted_metrics) giving exactly the scoring path's numbers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from refmetrics import reference_metrics

from core.errors import InvalidInputError
from core.scoring.metrics import (
    EMITTED,
    chunk_metrics,
    emitted_metrics,
    entropy,
    log_probs,
    step_metrics,
    target_metrics,
    top_probability,
)
from core.scoring.registry import (
    DEFAULT_SCORE,
    INT_METRICS,
    METRICS,
    SCORES,
    check_score,
    score_values,
)

ROOT = Path(__file__).resolve().parents[1]
LOG2 = math.log(2.0)


def run(a: np.ndarray, b: np.ndarray, y: np.ndarray | None, k: int = 10) -> dict[str, np.ndarray]:
    out = chunk_metrics(torch.from_numpy(a), torch.from_numpy(b), None if y is None else torch.from_numpy(y), k=k)
    return {name: value.numpy() for name, value in out.items()}


def random_block(seed: int, c: int, v: int, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Float32 base/reason logits that agree partly (correlated), and targets drawn from the base."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(c, v)) * scale
    b = 0.6 * a + 0.8 * rng.normal(size=(c, v)) * scale
    y = rng.integers(0, v, size=c)
    y[: c // 2] = np.argmax(a[: c // 2], axis=-1)  # some targets are the base's top token (rank 0)
    return a.astype(np.float32), b.astype(np.float32), y.astype(np.int64)


# -- against the brute-force reference ---------------------------------------------------------------


@pytest.mark.parametrize(("c", "v", "scale"), [(16, 50, 1.0), (24, 1000, 4.0), (8, 4096, 12.0), (3, 32000, 3.0)])
def test_every_metric_matches_float64_reference(c: int, v: int, scale: float) -> None:
    a, b, y = random_block(seed=v, c=c, v=v, scale=scale)
    got = run(a, b, y)
    ref = reference_metrics(a.astype(np.float64), b.astype(np.float64), y)
    assert set(METRICS) <= set(got)
    for name in METRICS:
        err = np.max(np.abs(got[name].astype(np.float64) - ref[name]))
        assert err <= 1e-5, f"{name}: max abs error {err:.3g} vs float64 reference"
    for side in ("base", "reason"):
        assert np.max(np.abs(got[f"topk_{side}_probs"] - ref[f"topk_{side}_probs"])) <= 1e-6
    for name in INT_METRICS:
        assert got[name].dtype.kind == "i", name


@pytest.mark.parametrize(("c", "v"), [(70, 6000), (40, 32000)])
def test_large_vocabulary_blocks_and_near_top_targets(c: int, v: int) -> None:
    """More rows than one inner block, a vocabulary tail past the top-k blocks, targets at ranks 0..20
    (read off the top-k) and far down (counted), against the reference."""
    a, b, y = random_block(seed=c, c=c, v=v, scale=5.0)
    order = np.argsort(-a, axis=-1, kind="stable")
    y[: c // 2] = order[np.arange(c // 2), np.arange(c // 2) % 21]
    y[-1] = v - 1  # in the tail
    got = run(a, b, y, k=10)
    ref = reference_metrics(a.astype(np.float64), b.astype(np.float64), y)
    for name in METRICS:
        np.testing.assert_allclose(got[name].astype(np.float64), ref[name], atol=1e-5, rtol=0, err_msg=name)
    for side, logits in (("base", a), ("reason", b)):
        expected = np.argsort(-logits, axis=-1, kind="stable")[:, :10]
        np.testing.assert_array_equal(got[f"topk_{side}_ids"], expected)
        np.testing.assert_allclose(got[f"topk_{side}_probs"], ref[f"topk_{side}_probs"], atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.integers(5300, 7000), st.integers(1, 40), st.integers(0, 2**32 - 1), st.integers(1, 12))
def test_topk_and_ranks_with_many_ties(v: int, c: int, seed: int, k: int) -> None:
    """Integer logits tie massively: top-k must still be a valid top-k and ranks count strictly larger ones."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-4, 3, size=(c, v)).astype(np.float32)
    b = rng.integers(-4, 3, size=(c, v)).astype(np.float32)
    y = rng.integers(0, v, size=c)
    got = run(a, b, y, k=k)
    for i in range(c):
        for side, logits in (("base", a[i]), ("reason", b[i])):
            ids, probs = got[f"topk_{side}_ids"][i], got[f"topk_{side}_probs"][i]
            assert len(set(ids.tolist())) == k
            np.testing.assert_array_equal(logits[ids], np.sort(logits)[::-1][:k])
            assert (np.diff(probs) <= 0).all()
        assert got["rank_base"][i] == np.sum(a[i] > a[i][y[i]])
        assert got["rank_reason"][i] == np.sum(b[i] > b[i][y[i]])
        assert got["reason_top_rank_in_base"][i] == np.sum(a[i] > a[i][np.argmax(b[i])])


def test_hand_computed_values() -> None:
    """Two-token distributions worked out by hand: p = (1/2, 1/2), q = (1/4, 3/4)."""
    a = np.zeros((1, 2), dtype=np.float64)
    b = np.log(np.array([[0.25, 0.75]]))
    got = run(a, b, np.array([0]))
    h_b = math.log(2.0)
    h_r = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    ce = -(0.5 * math.log(0.25) + 0.5 * math.log(0.75))
    m = (0.375, 0.625)
    jsd = 0.5 * (0.5 * math.log(0.5 / m[0]) + 0.5 * math.log(0.5 / m[1])) + 0.5 * (
        0.25 * math.log(0.25 / m[0]) + 0.75 * math.log(0.75 / m[1])
    )
    expected = {
        "entropy_base": h_b, "entropy_reason": h_r, "cross_entropy": ce, "kl_base_reason": ce - h_b,
        "kl_reason_base": 0.25 * math.log(0.5) + 0.75 * math.log(1.5), "jsd": jsd,
        "logp_base": math.log(0.5), "logp_reason": math.log(0.25), "delta_logp": math.log(0.5),
        "rank_base": 0, "rank_reason": 1, "reason_top_rank_in_base": 0,
    }
    assert set(expected) == set(METRICS)
    for name, value in expected.items():
        assert got[name][0] == pytest.approx(value, abs=1e-12), name


def test_float64_in_float64_out_and_float32_otherwise() -> None:
    a, b, y = random_block(1, 4, 30, 2.0)
    assert run(a.astype(np.float64), b.astype(np.float64), y)["jsd"].dtype == np.float64
    assert run(a, b, y)["jsd"].dtype == np.float32
    half = chunk_metrics(torch.from_numpy(a).half(), torch.from_numpy(b).bfloat16(), torch.from_numpy(y))
    assert half["cross_entropy"].dtype == torch.float32


def test_no_targets_gives_nan_and_minus_one() -> None:
    a, b, _ = random_block(2, 5, 40, 2.0)
    got = run(a, b, None)
    for name in ("logp_base", "logp_reason", "delta_logp"):
        assert np.isnan(got[name]).all()
    for name in ("rank_base", "rank_reason"):
        assert (got[name] == -1).all()
    ref = reference_metrics(a.astype(np.float64), b.astype(np.float64), None)
    for name in ("entropy_base", "cross_entropy", "jsd", "reason_top_rank_in_base"):
        np.testing.assert_allclose(got[name], ref[name], atol=1e-5)


def test_shape_mismatch_is_rejected() -> None:
    with pytest.raises(InvalidInputError, match=r"\(2, 5\).*\(2, 6\)"):
        chunk_metrics(torch.zeros(2, 5), torch.zeros(2, 6), None)


def test_k_larger_than_vocabulary_is_capped() -> None:
    a, b, y = random_block(3, 2, 4, 1.0)
    got = run(a, b, y, k=10)
    assert got["topk_base_ids"].shape == (2, 4)
    assert sorted(got["topk_base_ids"][0].tolist()) == [0, 1, 2, 3]


# -- one implementation: the decoding entry points equal the scoring path ------------------------------------


@pytest.mark.parametrize(("c", "v"), [(5, 151_936), (40, 3000)])
def test_step_then_emitted_equals_chunk_metrics_bit_for_bit(c: int, v: int) -> None:
    """Decoding's two calls (before and after the token is chosen) give exactly scoring's numbers, and
    they are within 1e-5 of float64 at a full-size vocabulary (torch.log_softmax was off by 2.1e-5)."""
    a, b, y = random_block(seed=c, c=c, v=v, scale=4.0)
    ta, tb, ty = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(y)
    whole = chunk_metrics(ta, tb, ty)
    m, lp = step_metrics(ta, tb)
    assert len(lp) == c and lp.base.shape == (c, v)
    for name in EMITTED:  # unknown until the token is chosen
        assert (m[name] == -1).all() if name in INT_METRICS else m[name].isnan().all(), name
    m.update(emitted_metrics(lp, ty))
    assert set(m) == set(whole)
    for name in whole:
        assert torch.equal(m[name], whole[name]), name
    for name, value in target_metrics(ta, tb, ty).items():
        assert torch.equal(value, whole[name]), name
    assert torch.equal(entropy(ta), whole["entropy_base"])
    assert torch.equal(log_probs(ta), lp.base)
    ref = reference_metrics(a.astype(np.float64), b.astype(np.float64), y)
    for name in METRICS:
        err = np.max(np.abs(whole[name].numpy().astype(np.float64) - ref[name]))
        assert err <= 1e-5, f"{name}: {err:.3g}"


def test_emitted_metrics_for_a_subset_of_rows_and_errors() -> None:
    a, b, y = random_block(seed=4, c=6, v=500, scale=3.0)
    ta, tb, ty = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(y)
    _, lp = step_metrics(ta, tb)
    rows = [1, 4]
    part = emitted_metrics(lp.rows(rows), ty[rows])
    whole = chunk_metrics(ta, tb, ty)
    for name in EMITTED:
        assert torch.equal(part[name], whole[name][rows]), name
    with pytest.raises(InvalidInputError, match="3 targets for 6 positions"):
        emitted_metrics(lp, ty[:3])
    with pytest.raises(InvalidInputError, match="positions, vocabulary"):
        chunk_metrics(ta[0], tb[0], None)


def test_entropy_of_masked_logits_is_finite() -> None:
    x = torch.tensor([[0.0, 0.0, -float("inf")], [1.0, 2.0, 3.0]])
    expected = [math.log(2.0), float(-(torch.softmax(x[1].double(), -1) * torch.log_softmax(x[1].double(), -1)).sum())]
    np.testing.assert_allclose(entropy(x).numpy(), expected, atol=1e-6)


@given(a=hnp.arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 30)),
                   elements=st.floats(min_value=-40, max_value=40, allow_nan=False, width=32)))
@settings(max_examples=60, deadline=None)
def test_top_probability_is_the_largest_softmax_probability(a: np.ndarray) -> None:
    """What ends a verify-ahead block early (core/decoding/block_sizing.py) is each row's largest probability."""
    x = a.astype(np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(top_probability(torch.from_numpy(a)).numpy(), (p / p.sum(-1, keepdims=True)).max(-1),
                               rtol=1e-5, atol=1e-7)


# -- identities (hypothesis) -----------------------------------------------------------------------

logit = st.floats(min_value=-40, max_value=40, allow_nan=False, width=32)


@st.composite
def blocks(draw, max_c: int = 4, max_v: int = 24):
    c = draw(st.integers(1, max_c))
    v = draw(st.integers(2, max_v))
    a = draw(hnp.arrays(np.float32, (c, v), elements=logit))
    b = draw(hnp.arrays(np.float32, (c, v), elements=logit))
    y = draw(hnp.arrays(np.int64, (c,), elements=st.integers(0, v - 1)))
    return a, b, y


def _softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@settings(max_examples=60, deadline=None)
@given(blocks())
def test_identities_hold(block) -> None:
    a, b, y = block
    got = run(a, b, y)
    v = a.shape[1]
    tol = 2e-5
    ce_direct = -(_softmax64(a) * np.log(np.clip(_softmax64(b), 1e-300, None))).sum(-1)
    # CE = H_b + KL(p‖q), and it is the cross-entropy computed directly
    np.testing.assert_allclose(got["cross_entropy"], got["entropy_base"] + got["kl_base_reason"], atol=tol, rtol=1e-6)
    np.testing.assert_allclose(got["cross_entropy"], ce_direct, atol=1e-4, rtol=1e-5)
    assert (got["kl_base_reason"] >= 0).all() and (got["kl_reason_base"] >= 0).all()
    assert (got["jsd"] >= 0).all() and (got["jsd"] <= LOG2).all()
    for h in (got["entropy_base"], got["entropy_reason"]):
        assert (h >= -tol).all() and (h <= math.log(v) + tol).all()
    np.testing.assert_allclose(got["delta_logp"], got["logp_reason"] - got["logp_base"], atol=tol)
    # JSD ≤ ¼ (KL(p‖q) + KL(q‖p)) (convexity of KL in its second argument)
    assert (got["jsd"] <= 0.25 * (got["kl_base_reason"] + got["kl_reason_base"]) + tol).all()


@settings(max_examples=40, deadline=None)
@given(blocks())
def test_identical_logits_give_zero_divergence(block) -> None:
    a, _, y = block
    got = run(a, a.copy(), y)
    np.testing.assert_allclose(got["kl_base_reason"], 0.0, atol=1e-6)
    np.testing.assert_allclose(got["kl_reason_base"], 0.0, atol=1e-6)
    np.testing.assert_allclose(got["jsd"], 0.0, atol=1e-6)
    np.testing.assert_allclose(got["cross_entropy"], got["entropy_base"], atol=1e-5)
    np.testing.assert_array_equal(got["delta_logp"], 0.0)
    np.testing.assert_array_equal(got["rank_base"], got["rank_reason"])
    assert (got["reason_top_rank_in_base"] == 0).all()


@settings(max_examples=80, deadline=None)
@given(blocks(max_v=16))
def test_ranks_agree_with_sorting(block) -> None:
    """rank = the target's place in the descending sort; logits closer than float32 rounding may tie."""
    a, b, y = block
    got = run(a, b, y)

    def bounds(logits: np.ndarray, token: int) -> tuple[int, int]:
        x = logits.astype(np.float64)
        eps = 1e-5 * (1.0 + np.abs(x).max())
        return int(np.sum(x > x[token] + eps)), int(np.sum(x > x[token] - eps))

    for i in range(len(a)):
        for logits, token, rank in ((a[i], y[i], got["rank_base"][i]), (b[i], y[i], got["rank_reason"][i])):
            clearly_above, above_or_tied = bounds(logits, token)
            assert clearly_above <= rank <= above_or_tied
        # argmax q: any token whose logit ties the maximum up to rounding may be the one chosen
        eps = 1e-5 * (1.0 + np.abs(b[i]).max())
        candidates = np.flatnonzero(b[i] >= b[i].max() - eps)
        low = min(bounds(a[i], t)[0] for t in candidates)
        high = max(bounds(a[i], t)[1] for t in candidates)
        assert low <= got["reason_top_rank_in_base"][i] <= high
        if y[i] == np.argmax(a[i]):
            assert got["rank_base"][i] == 0


@settings(max_examples=60, deadline=None)
@given(blocks(), st.integers(1, 12))
def test_topk_is_descending_and_matches_softmax(block, k: int) -> None:
    a, b, y = block
    got = run(a, b, y, k=k)
    kk = min(k, a.shape[1])
    for side, logits in (("base", a), ("reason", b)):
        ids, probs = got[f"topk_{side}_ids"], got[f"topk_{side}_probs"]
        assert ids.shape == probs.shape == (len(a), kk)
        assert (np.diff(probs, axis=-1) <= 0).all()
        soft = _softmax64(logits)
        np.testing.assert_allclose(probs, np.take_along_axis(soft, ids, -1), atol=1e-6)
        np.testing.assert_allclose(probs, -np.sort(-soft, axis=-1)[:, :kk], atol=1e-6)
        assert all(len(set(row)) == kk for row in ids.tolist())


# -- extreme inputs ---------------------------------------------------------------------------------


def test_extreme_and_masked_logits_stay_finite() -> None:
    v = 64
    rng = np.random.default_rng(5)
    a = rng.normal(size=(6, v)).astype(np.float32)
    b = rng.normal(size=(6, v)).astype(np.float32)
    a[0, 3], b[0, 9] = 1e4, 1e4  # each model certain, of different tokens
    a[1, :], b[1, :] = -1e4, 1e4  # uniform, huge magnitudes
    a[2, 5], b[2, 5] = 1e4, -1e4  # base certain of a token the reasoner rules out
    masked = [0, 1, 2, 40, 63]
    a[3:, masked] = -np.inf  # both models mask the same tokens (e.g. a logits processor)
    b[3:, masked] = -np.inf
    a[5, 7] = -1e4
    y = np.array([3, 2, 5, 4, 7, 8])
    got = run(a, b, y)
    for name in METRICS:
        assert np.isfinite(got[name].astype(np.float64)).all(), (name, got[name])
    assert got["kl_base_reason"][0] == pytest.approx(1e4, rel=1e-3)
    assert got["jsd"][0] == pytest.approx(LOG2, abs=1e-6)
    assert got["entropy_base"][1] == pytest.approx(math.log(v), abs=1e-5)
    for side in ("base", "reason"):
        assert not np.isin(got[f"topk_{side}_ids"][3:], masked).any()
        assert np.isfinite(got[f"topk_{side}_probs"]).all()
    ref = reference_metrics(a.astype(np.float64), b.astype(np.float64), y)
    for name in METRICS:
        np.testing.assert_allclose(got[name], ref[name], atol=1e-5, rtol=1e-6, err_msg=name)


def test_masked_rows_among_many() -> None:
    """-inf logits in a few rows of a large block: those rows take the exact masked path, the rest not."""
    a, b, y = random_block(seed=9, c=45, v=6000, scale=3.0)
    masked = np.arange(0, 6000, 7)
    masked = masked[~np.isin(masked, y)]
    for row in (3, 40):
        a[row, masked] = -np.inf
        b[row, masked] = -np.inf
    got = run(a, b, y)
    ref = reference_metrics(a.astype(np.float64), b.astype(np.float64), y)
    for name in METRICS:
        assert np.isfinite(got[name].astype(np.float64)).all(), name
        np.testing.assert_allclose(got[name].astype(np.float64), ref[name], atol=1e-5, rtol=0, err_msg=name)


def test_support_mismatch_gives_infinite_kl_only() -> None:
    """q puts mass where p has none: KL(q‖p) is +inf (true value); everything else stays finite."""
    a = np.array([[0.0, 0.0, -np.inf]], dtype=np.float32)
    b = np.array([[0.0, 0.0, 0.0]], dtype=np.float32)
    got = run(a, b, np.array([1]))
    assert got["kl_reason_base"][0] == np.inf
    for name in METRICS:
        if name != "kl_reason_base":
            assert np.isfinite(got[name].astype(np.float64)).all(), name
    assert got["kl_base_reason"][0] == pytest.approx(math.log(1.5), abs=1e-6)


# -- the registry --------------------------------------------------------------------------------


def test_registry_is_consistent() -> None:
    assert DEFAULT_SCORE in SCORES
    assert set(SCORES) <= set(METRICS)
    assert set(INT_METRICS) <= set(METRICS)
    for name, metric in METRICS.items():
        assert metric.name == name
        assert metric.doc.strip(), f"metric {name!r} has no doc"


def test_score_values_orientation_and_errors() -> None:
    metrics = {name: np.array([1.0, -2.0]) for name in METRICS}
    np.testing.assert_array_equal(score_values(metrics, "delta_logp"), [-1.0, 2.0])
    np.testing.assert_array_equal(score_values(metrics, "cross_entropy"), [1.0, -2.0])
    with pytest.raises(InvalidInputError) as err:
        check_score("kll")
    assert "'kll'" in str(err.value) and all(name in str(err.value) for name in SCORES)
    with pytest.raises(InvalidInputError):
        score_values(metrics, "rank_base")  # a metric, but not a score


def test_every_metric_is_documented() -> None:
    docs = [ROOT / "docs" / "ARCHITECTURE.md", ROOT / "README.md"]
    text = "\n".join(path.read_text(encoding="utf-8") for path in docs if path.exists())
    if not text:
        pytest.skip("no docs/ARCHITECTURE.md or README.md yet (registry docs are checked above)")
    missing = [name for name in METRICS if f"`{name}`" not in text and name not in text]
    assert not missing, f"metrics not documented in docs/ARCHITECTURE.md or README.md: {missing}"
