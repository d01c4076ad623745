"""core.instruments.effects: takeover effects and the success curve on the demo pair, their intervals,
the batched continuations against the one-row branch path, and reuse from the store."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import core
from core.errors import GenerationCancelled, InvalidInputError
from core.instruments import effects as fx
from core.instruments import success_curve as sc
from core.instruments.intervals import Z95, newcombe, spearman, wilson

# -- intervals against hand values and float64 brute force ------------------------------------


def _wilson_roots(s: int, n: int) -> tuple[float, float]:
    """The Wilson interval as the roots of (s/n - p)^2 = z^2 p (1 - p) / n, solved as a quadratic."""
    p, z2 = s / n, Z95 ** 2
    roots = np.sort(np.roots([1 + z2 / n, -(2 * p + z2 / n), p * p]).real)
    return float(roots[0]), float(roots[1])


@given(st.integers(1, 200).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
@settings(max_examples=200, deadline=None)
def test_wilson_is_the_score_interval(sn) -> None:
    s, n = sn
    low, high = wilson(s, n)
    ref = _wilson_roots(s, n)
    assert low == pytest.approx(ref[0], abs=1e-9) and high == pytest.approx(ref[1], abs=1e-9)
    assert 0 <= low <= s / n <= high <= 1


def test_newcombe_matches_his_published_examples() -> None:
    # Newcombe (1998), Statistics in Medicine 17:873, Table II, method 10
    for (s1, n1, s2, n2), (low, high) in {(56, 70, 48, 80): (0.0524, 0.3339), (9, 10, 3, 10): (0.1705, 0.8090),
                                          (10, 10, 0, 10): (0.6075, 1.0), (0, 10, 0, 10): (-0.2775, 0.2775)}.items():
        got = newcombe(s1, n1, s2, n2)
        assert got == pytest.approx((low, high), abs=6e-5), (s1, n1, s2, n2)


@given(st.integers(1, 60), st.integers(1, 60), st.data())
@settings(max_examples=100, deadline=None)
def test_newcombe_holds_the_difference(n1: int, n2: int, data) -> None:
    s1, s2 = data.draw(st.integers(0, n1)), data.draw(st.integers(0, n2))
    low, high = newcombe(s1, n1, s2, n2)
    assert -1 <= low <= s1 / n1 - s2 / n2 <= high <= 1


@given(st.lists(st.floats(-1e3, 1e3), min_size=3, max_size=30, unique=True), st.randoms())
@settings(max_examples=60, deadline=None)
def test_spearman_without_ties_is_the_rank_formula(xs: list[float], rnd) -> None:
    ys = list(xs)
    rnd.shuffle(ys)
    rx, ry = np.argsort(np.argsort(xs)), np.argsort(np.argsort(ys))
    n = len(xs)
    ref = 1 - 6 * float(((rx - ry) ** 2).sum()) / (n * (n * n - 1))
    assert spearman(xs, ys) == pytest.approx(ref, abs=1e-9)


# -- the demo organism --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo():
    """The demo pair and a greedy base trace that fails at a plan token (the card's organism)."""
    pair = core.demo_pair()
    problem = core.demo_problems(limit=2)[1]  # "Sam splits 6 beads into 3 equal piles ...": the base adds
    trace = core.generate(pair, problem, max_new_tokens=80)
    return pair, trace


def _decision(trace) -> int:
    """The plan token: the largest cross-entropy where the two models' top choices differ."""
    differ = trace.topk["base"][0][:, 0] != trace.topk["reason"][0][:, 0]
    ce = np.where(differ, trace.metrics["cross_entropy"], -np.inf)
    return int(np.argmax(ce))


def _agreement(trace) -> int:
    """An early token where both models agree confidently (the restatement)."""
    same = (trace.topk["base"][0][:, 0] == trace.topk["reason"][0][:, 0]) & (trace.metrics["cross_entropy"] < 0.01)
    return int(np.flatnonzero(same)[2])


def test_effect_is_positive_at_the_decision_token_and_absent_where_models_agree(demo, tmp_path) -> None:
    pair, trace = demo
    decision, agree = _decision(trace), _agreement(trace)
    assert trace.tokens[decision] == " add" and trace.meta.get("correct") is None
    store = core.TraceStore(tmp_path / "store")
    frame = fx.takeover_effects(pair, trace, [agree, decision], samples=12, store=store)
    assert list(frame.columns) == fx.EFFECT_COLUMNS and list(frame["pos"]) == [agree, decision]
    at = frame.set_index("pos")
    row = at.loc[decision]
    assert row.base_token == " add" and row.reason_token == " divide" and row.n == 12
    assert row.effect > 0.5 and row.ci_low > 0, row.to_dict()
    assert row.effect == pytest.approx(row.acc_with - row.acc_without)
    assert (row.ci_low, row.ci_high) == pytest.approx(newcombe(round(row.acc_with * 12), 12, round(row.acc_without * 12), 12))
    calm = at.loc[agree]
    assert calm.ci_low <= 0 <= calm.ci_high and abs(calm.effect) <= 0.25, calm.to_dict()
    # every continuation is a graded child of the trace in the store
    keys = " ".join(frame["keys_with"].tolist() + frame["keys_without"].tolist()).split()
    assert len(set(keys)) == 48 and set(keys) <= set(store.children(trace.key))
    kids = [store.get(k) for k in row.keys_with.split()]
    assert all(k.meta["branch_pos"] == decision and k.meta["correct"] is not None for k in kids)
    assert all(k.tokens[:decision] == trace.tokens[:decision] and k.source[decision] == "reason" for k in kids)
    assert sum(k.meta["correct"] for k in kids) == round(row.acc_with * 12)
    # the Dataset page rebuilds the same rows from the store, without a model
    rebuilt = fx.stored_effects(store, trace)
    cols = ["pos", "acc_with", "acc_without", "effect", "ci_low", "ci_high", "n"]
    assert rebuilt[cols].equals(frame[cols])
    assert set(rebuilt["keys_with"].str.split().sum()) == set(frame["keys_with"].str.split().sum())
    assert rebuilt.set_index("pos").loc[decision, "reason_token"] == " divide"


def test_stored_effects_reads_only_the_continuations_whole(demo, tmp_path) -> None:
    """A trace explored on the switchboard has many children that are not continuations: their footers say so,
    and only the continuations are read whole (the view of a trace rebuilds its effects on every new child)."""
    pair, trace = demo
    reads: list[str] = []

    class Store(core.TraceStore):
        def get(self, key):
            reads.append(key)
            return super().get(key)

    store = Store(tmp_path / "store")
    decision = _decision(trace)
    frame = fx.takeover_effects(pair, trace, [decision], samples=2, store=store)
    before = fx.stored_effects(store, trace)
    for pos in (2, 5, 9):  # a user's switches: children of the trace that measure nothing
        core.takeover(pair, trace, {pos: int(trace.topk["base"][0][pos][1])}, store=store)
    assert len(store.children(trace.key)) == 4 + 3
    reads.clear()
    after = fx.stored_effects(store, trace)
    assert after.equals(before) and list(after["pos"]) == list(frame["pos"]) == [decision]
    assert sorted(reads) == sorted(" ".join(frame["keys_with"].tolist() + frame["keys_without"].tolist()).split())


def test_each_continuation_is_stored_once_already_graded(demo, tmp_path) -> None:
    """The kernel grades a new continuation (on_trace) before its one store write: no ungraded copy first."""
    pair, trace = demo
    puts: list[tuple[str, object]] = []

    class Store(core.TraceStore):
        def put(self, t, **kw):
            puts.append((t.key, t.meta.get("correct")))
            return super().put(t, **kw)

    store = Store(tmp_path / "store")
    frame = fx.takeover_effects(pair, trace, [_decision(trace)], samples=3, store=store)
    keys = frame.loc[0, "keys_with"].split() + frame.loc[0, "keys_without"].split()
    assert sorted(k for k, _ in puts) == sorted(keys) and all(c is not None for _, c in puts)


def test_a_rerun_reads_every_continuation_back(demo, tmp_path, monkeypatch) -> None:
    pair, trace = demo
    store = core.TraceStore(tmp_path / "store")
    first = fx.takeover_effects(pair, trace, [_decision(trace)], samples=4, store=store)

    def no_decoding(*args, **kwargs):
        raise AssertionError("a stored continuation was decoded again")

    monkeypatch.setattr("core.decoding.engine.Decoder.run", no_decoding)
    again = fx.takeover_effects(pair, trace, [_decision(trace)], samples=4, store=store)
    assert again.equals(first)


def test_a_batch_of_continuations_equals_each_alone_and_the_branch_path(demo) -> None:
    pair, trace = demo
    pos = _decision(trace)
    seeds = fx.sample_seeds(0, pos, 3)
    batch = fx._continue(pair, trace, pos, ["reason", "base", "reason"], seeds, temperature=0.6)
    for who, seed, kid in zip(["reason", "base", "reason"], seeds, batch):
        alone = fx._continue(pair, trace, pos, [who], [seed], temperature=0.6)[0]
        assert alone.tokens == kid.tokens and list(alone.source) == list(kid.source)
        np.testing.assert_allclose(alone.metrics["cross_entropy"], kid.metrics["cross_entropy"], atol=1e-5)
        assert alone.key == kid.key
    # greedy: the reasoner writing pos, then the trace's policy (base only) is core.branch's child
    greedy = fx._continue(pair, trace, pos, ["reason"], [0], temperature=0.0)[0]
    child = core.branch(pair, trace, pos)
    assert greedy.tokens == child.tokens and list(greedy.source) == list(child.source)
    np.testing.assert_allclose(greedy.metrics["kl_base_reason"], child.metrics["kl_base_reason"], atol=1e-5)
    assert greedy.meta["correct"] is True and greedy.meta["parent"] == trace.key


def test_spikes_are_the_default_positions_and_the_seeds_are_keyed_by_position(demo) -> None:
    pair, trace = demo
    frame = fx.takeover_effects(pair, trace, samples=2)
    assert list(frame["pos"]) == sorted(int(p) for p in core.spikes(trace).annotations["spikes"]["positions"])
    assert fx.sample_seeds(0, 5, 3) == fx.sample_seeds(0, 5, 4)[:3] != fx.sample_seeds(0, 6, 3)
    greedy = fx.takeover_effects(pair, trace, [_decision(trace)], samples=5, temperature=0.0)
    assert greedy["n"].tolist() == [1] and greedy["effect"].tolist() == [1.0]


def test_bad_input_is_refused_and_a_stop_cancels(demo) -> None:
    pair, trace = demo
    with pytest.raises(InvalidInputError, match="outside the trace"):
        fx.takeover_effects(pair, trace, [len(trace)], samples=2)
    with pytest.raises(InvalidInputError, match="samples"):
        fx.takeover_effects(pair, trace, [3], samples=0)
    with pytest.raises(InvalidInputError, match="'spikes'"):
        fx.takeover_effects(pair, trace, "everywhere", samples=2)
    no_gold = core.generate(pair, "Ann has 2 cups and finds 3 more. How many cups does Ann have now?", max_new_tokens=40)
    with pytest.raises(InvalidInputError, match="no gold"):
        fx.takeover_effects(pair, no_gold, [3], samples=2)
    with pytest.raises(InvalidInputError, match="who"):
        fx._continue(pair, trace, 3, ["nobody"], [0], temperature=0.6)
    with pytest.raises(GenerationCancelled):
        fx.takeover_effects(pair, trace, [3], samples=2, should_stop=lambda: True)
    seen = []
    fx.takeover_effects(pair, trace, [3, 4], samples=2, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(1, 2), (2, 2)]


def test_success_curve_finds_the_decision_token_by_bisection(demo) -> None:
    pair, trace = demo
    decision = _decision(trace)
    fixed = core.branch(pair, trace, decision)  # the reasoner's plan token: this response is right
    curve = sc.success_curve(pair, fixed, samples=8)
    assert list(curve.columns) == sc.CURVE_COLUMNS
    assert curve["pos"].is_monotonic_increasing and curve["pos"].iloc[0] == 0 and curve["pos"].iloc[-1] == len(fixed)
    assert curve["p"].iloc[0] < 0.5 and curve["p"].iloc[-1] == 1.0 and curve["n"].iloc[-1] == 0
    pivots = curve[curve["pivotal"]]
    assert decision in set(pivots["pos"]) and pivots.set_index("pos").loc[decision, "jump"] > 0.5
    assert pivots.set_index("pos").loc[decision, "token"] == " divide"
    assert len(curve) < len(fixed) // 2  # bisection, not every prefix
    inside = curve[curve["n"] > 0]
    assert ((inside["ci_low"] <= inside["p"]) & (inside["p"] <= inside["ci_high"])).all()
    assert not math.isnan(sc.pivot_correlation(curve)) or len(curve.dropna(subset=["jump"])) < 3


def test_cli_effects_writes_the_csv_stores_the_continuations_and_resumes(tmp_path, monkeypatch) -> None:
    import pandas as pd
    from click.testing import CliRunner

    from core.cli import main

    store, out = tmp_path / "store", tmp_path / "fx.csv"
    args = ["effects", "--store", str(store), "--limit", "2", "--samples", "3", "--max-new-tokens", "80",
            "--positions", "spikes", "--out", str(out)]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out)
    assert list(table.columns) == fx.EFFECT_COLUMNS and len(table) >= 1 and (table["n"] == 3).all()
    assert "Newcombe" in result.output
    kept = core.TraceStore(store)
    assert all(k in kept for k in " ".join(table["keys_with"]).split())
    again = CliRunner().invoke(main, args, catch_exceptions=False)
    assert again.exit_code != 0 and "--overwrite" in again.output
    monkeypatch.setattr("core.decoding.engine.Decoder.run", lambda *a, **k: pytest.fail("decoded again"))
    rerun = CliRunner().invoke(main, [*args, "--overwrite"], catch_exceptions=False)
    assert rerun.exit_code == 0, rerun.output
    pd.testing.assert_frame_equal(pd.read_csv(out), table)
    bad = CliRunner().invoke(main, ["effects", "--store", str(store), "--positions", "a,b", "--out", str(tmp_path / "x.csv")])
    assert bad.exit_code == 2 and "--positions" in bad.output


def test_cli_curve_prints_the_success_curve_and_its_pivotal_tokens(demo, tmp_path) -> None:
    """`forkpoint curve KEY`: the same curve as core.success_curve, continuations stored (a rerun reads them)."""
    import io

    import pandas as pd
    from click.testing import CliRunner

    from core.cli import main

    pair, trace = demo
    store = core.TraceStore(tmp_path / "store")
    store.put(trace)
    args = ["curve", trace.key, "--store", str(store.path), "--samples", "3", "--csv"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    table = pd.read_csv(io.StringIO(result.output[result.output.index("trace,"):]))
    want = sc.success_curve(pair, trace, 3, store=store)
    assert list(table["pos"]) == list(want["pos"]) and np.allclose(table["p"], want["p"])
    text = CliRunner().invoke(main, ["curve", trace.key, "--store", str(store.path), "--samples", "3"])
    assert text.exit_code == 0 and "pivotal token" in text.output
    bad = CliRunner().invoke(main, ["curve", "nope", "--store", str(store.path)])  # KEY as --help shows it
    assert bad.exit_code == 2 and "Invalid value for KEY: no readable trace 'nope'" in bad.output
    bad = CliRunner().invoke(main, ["effects", "--key", trace.key, "--key", "nope", "--key", "nope2", "--store",
                                    str(store.path), "--out", str(tmp_path / "e.csv")])
    assert bad.exit_code == 2 and "Invalid value for --key: no readable trace 'nope', 'nope2'" in bad.output


# -- spread over an executor (the Ray test is in test_scale_ray.py, on that file's Ray) -----------


def test_an_executor_gives_the_in_process_table_and_stores_the_same_continuations(demo, tmp_path) -> None:
    import pandas as pd

    from core.scale import InProcessExecutor, PairSpec

    pair, trace = demo
    where = [_agreement(trace), _decision(trace)]
    ref_store, store = core.TraceStore(tmp_path / "a"), core.TraceStore(tmp_path / "b")
    ref = fx.takeover_effects(pair, trace, where, samples=3, store=ref_store)
    seen = []
    executor = InProcessExecutor()
    got = fx.takeover_effects(pair, trace, where, samples=3, store=store, executor=executor,
                              progress=lambda d, t: seen.append((d, t)))
    pd.testing.assert_frame_equal(got, ref)
    assert sorted(store.keys()) == sorted(ref_store.keys()) and seen == [(1, 2), (2, 2)]
    assert executor.summary()["units"].sum() == 12  # 2 positions x 2 arms x 3 samples, made by the worker
    assert all(store.get(k).meta["correct"] is not None for k in store.keys())  # noqa: SIM118  (a store, not a dict)
    # a rerun reads everything back: nothing reaches the worker
    again = fx.measure_effects(pair, [trace, trace], where, 3, store=store, executor=executor)
    assert executor.summary()["units"].sum() == 0
    pd.testing.assert_frame_equal(again, pd.concat([ref, ref], ignore_index=True))
    # a driver that only ships the pair names tokens from the tokenizer alone, as the loaded pair does
    spec = PairSpec.from_pair(pair)
    ids = [int(trace.topk[side][0][p, 0]) for side in ("base", "reason") for p in where]
    assert [spec.token_text(i) for i in ids] == [pair.token_text(i) for i in ids]


def test_cli_effects_ray_spreads_over_the_executor_and_writes_the_same_csv(tmp_path, monkeypatch) -> None:
    """`--ray` builds the executor from the shared options and hands every position to it (here an
    in-process stand-in for Ray, so the test needs no cluster); the CSV equals the in-process one."""
    import pandas as pd
    from click.testing import CliRunner

    import core.scale
    from core.cli import main

    made, kinds = [], []

    class FakeRay(core.scale.InProcessExecutor):
        def __init__(self, address=None, workers=None, gpus_per_worker=1):
            super().__init__()
            made.append((address, workers))
            self.jobs = []
            kinds.append(self.jobs)

        def run_jobs(self, pair, jobs, **kwargs):
            self.jobs += list(jobs)
            return super().run_jobs(pair, jobs, **kwargs)

        def close(self):
            made.append("closed")

    monkeypatch.setattr(core.scale, "RayExecutor", FakeRay)
    args = ["effects", "--limit", "2", "--samples", "2", "--max-new-tokens", "60", "--positions", "spikes"]
    plain = CliRunner().invoke(main, [*args, "--store", str(tmp_path / "a"), "--out", str(tmp_path / "a.csv")],
                               catch_exceptions=False)
    assert plain.exit_code == 0, plain.output
    spread = CliRunner().invoke(main, [*args, "--store", str(tmp_path / "b"), "--out", str(tmp_path / "b.csv"),
                                       "--ray", "--workers", "2"], catch_exceptions=False)
    assert spread.exit_code == 0, spread.output
    assert made[0] == (None, 2) and made[-1] == "closed"
    table = pd.read_csv(tmp_path / "a.csv")
    spread_jobs = [j for j in kinds[0] if type(j).__name__ == "ContinueJob"]
    assert sorted((j.trace.key, j.pos) for j in spread_jobs) == sorted(zip(table["trace"], table["pos"]))
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "b.csv"), pd.read_csv(tmp_path / "a.csv"))
    assert sorted(core.TraceStore(tmp_path / "b").keys()) == sorted(core.TraceStore(tmp_path / "a").keys())
    bad = CliRunner().invoke(main, [*args, "--store", str(tmp_path / "c"), "--out", str(tmp_path / "c.csv"),
                                    "--workers", "2"])
    assert bad.exit_code == 2 and "need --ray" in bad.output
