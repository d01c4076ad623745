"""core/analysis/comparison.py: one response against several reasoners that share the base."""

from __future__ import annotations

import numpy as np
import pytest

from app.state import DATASET_TAB_KEY
import core
from core.analysis import tables as A
from core.annotate.rank_shift import shifted_ratio
from core.errors import InvalidInputError, PairMismatchError
from core.analysis import comparison as cmp
from tests.apptest import first_trace, tiny_app
from tests.fakes import make_trace

PROMPT = "What is 2+3?"
RESPONSE = "2+3 = 5. Wait, check: 5. The answer is 5."


@pytest.fixture(scope="module")
def pairs(qwen_pair, tiny_dirs):
    other = cmp.with_reasoner(qwen_pair, str(tiny_dirs["llama_reason"]))
    same = cmp.with_reasoner(qwen_pair, str(tiny_dirs["qwen_base"]), reason_format=qwen_pair.formats["base"].spec)
    return [qwen_pair, other, same]


def test_with_reasoner_shares_the_base(pairs, qwen_pair):
    assert all(p.base is qwen_pair.base for p in pairs)
    assert pairs[1].reason is not qwen_pair.reason
    assert [cmp.reasoner_name(p) for p in pairs] == ["qwen_reason", "llama_reason", "qwen_base"]


def test_compare_equals_scoring_each_pair(pairs):
    comp = core.compare(pairs, PROMPT, RESPONSE)
    assert comp.names == ["qwen_reason", "llama_reason", "qwen_base"] and len(comp) > 5
    for pair, trace in zip(pairs, comp.traces):
        ref = core.score(pair, PROMPT, RESPONSE)
        assert trace.key == ref.key  # the same request: a stored compare is a stored score
        assert np.array_equal(trace.token_ids, ref.token_ids)
        for name in ref.metrics:
            np.testing.assert_allclose(trace.metrics[name], ref.metrics[name], rtol=1e-5, atol=1e-5, err_msg=name)
        for side in ("base", "reason"):
            assert np.array_equal(trace.topk[side][0], ref.topk[side][0])
    # the base side is the same under every reasoner (one base forward)
    for trace in comp.traces[1:]:
        np.testing.assert_allclose(trace.metrics["entropy_base"], comp.traces[0].metrics["entropy_base"], atol=1e-6)
    # the base against itself: no disagreement and every token unshifted
    same = comp.trace("qwen_base")
    np.testing.assert_allclose(same.metrics["kl_base_reason"], 0.0, atol=1e-5)
    assert shifted_ratio(same) == 0.0 and (same.metrics["reason_top_rank_in_base"] == 0).all()


def test_tables(pairs):
    comp = core.compare(pairs[:2], PROMPT, RESPONSE, names=["small", "big"])
    frame = comp.frame("cross_entropy")
    assert list(frame.columns) == ["pos", "token", "small", "small top", "small rank_shift", "big", "big top",
                                   "big rank_shift"]
    np.testing.assert_allclose(frame["big"], comp.trace("big").metrics["cross_entropy"])
    lo, hi = comp.value_range("cross_entropy")
    both = np.concatenate([t.metrics["cross_entropy"] for t in comp.traces])
    assert (lo, hi) == pytest.approx((both.min(), both.max()))
    table = comp.topk_table(3, decode=lambda i: f"<{i}>", k=4)
    assert table["rank"].tolist() == [1, 2, 3, 4]
    assert table["big"].tolist() == [f"<{i}>" for i in comp.trace("big").topk["reason"][0][3][:4]]
    np.testing.assert_allclose(table["small p"], comp.trace("small").topk["reason"][1][3][:4])
    assert table["base"].tolist() == [f"<{i}>" for i in comp.traces[0].topk["base"][0][3][:4]]
    with pytest.raises(InvalidInputError, match="outside"):
        comp.topk_table(len(comp))
    with pytest.raises(InvalidInputError, match="choose one of: small, big"):
        comp.trace("medium")


def test_store_reuses_compared_traces(pairs, tmp_path):
    store = core.TraceStore(tmp_path / "s")
    first = core.compare(pairs[:2], PROMPT, RESPONSE, store=store)
    assert sorted(store.keys()) == sorted(t.key for t in first.traces)
    again = core.compare(pairs[:2], PROMPT, RESPONSE, store=store)
    assert [t.meta["created"] for t in again.traces] == [t.meta["created"] for t in first.traces]


def test_pairs_must_share_the_base(qwen_pair, llama_pair):
    with pytest.raises(PairMismatchError, match="share the base"):
        core.compare([qwen_pair, llama_pair], PROMPT, RESPONSE)
    with pytest.raises(InvalidInputError, match="distinct"):
        core.compare([qwen_pair, qwen_pair], PROMPT, RESPONSE, names=["a", "a"])
    twice = core.compare([qwen_pair, qwen_pair], PROMPT, RESPONSE)  # same model id twice: names made distinct
    assert twice.names == ["qwen_reason (0)", "qwen_reason (1)"]


def test_dataset_tables_side_by_side():
    a = [make_trace(n_tokens=40, seed=s, annotate=True) for s in range(3)]
    b = [make_trace(n_tokens=30, seed=10 + s, annotate=True, sharpness=1.0) for s in range(2)]
    out = cmp.dataset_tables({"a": a, "b": b}, score="cross_entropy", top=0.1, bins=5)
    summary = out["summary"].set_index("reasoner")
    for name, traces in (("a", a), ("b", b)):
        ref = A.gini_table(traces, "cross_entropy")
        assert summary.loc[name, "gini"] == pytest.approx(float(ref[ref["trace"] == A.POOLED]["gini"].iloc[0]))
        assert summary.loc[name, "shifted_ratio"] == pytest.approx(shifted_ratio(traces))
        assert summary.loc[name, "tokens"] == sum(len(t) for t in traces)
        dens = out["position_density"][out["position_density"]["reasoner"] == name]
        ref_d = A.position_density(traces, "cross_entropy", top=0.1, bins=5)
        np.testing.assert_allclose(dens["density"], ref_d["density"])
    assert set(out["enrichment"]["reasoner"]) == {"a", "b"}
    groups = cmp.group_by_reasoner(a + b)
    assert sum(len(v) for v in groups.values()) == 5


# -- the app's Compare page (AppTest: page logic on the tiny pair) -----------------------------------------


@pytest.mark.slow
def test_compare_page_scores_a_stored_response_against_two_reasoners(tiny_dirs, tmp_path, monkeypatch):
    at = first_trace(tiny_app(tiny_dirs, tmp_path, monkeypatch))
    at.switch_page("screens/compare.py").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.checkbox(key="cmp_self").value is True  # no other reasoner typed: the base itself is offered
    at.button(key="cmp_go").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    _, comp = at.session_state["cmp_result"]
    assert comp.names == ["qwen_reason", "qwen_base (base itself)"]
    store = core.TraceStore(tmp_path / "store")
    assert {t.key for t in comp.traces} <= set(store.keys())  # stored: the Dataset page can compare them
    source = store.get(at.session_state["cmp_key"])
    assert {t.meta["problem"]["id"] for t in comp.traces} == {source.meta["problem"]["id"]} != {None}  # listed by it
    assert any("scored traces are in the store" in str(c.value) for c in at.caption)  # and the page says so
    np.testing.assert_allclose(comp.traces[1].metrics["kl_base_reason"], 0.0, atol=1e-5)
    frames = at.dataframe
    assert len(frames) >= 2
    topk = frames[0].value
    assert list(topk.columns) == ["rank", "base", "base p", *[c for n in comp.names for c in (n, f"{n} p")]]
    np.testing.assert_allclose(topk["qwen_reason p"], comp.traces[0].topk["reason"][1][0])
    rows = [h.proto.body for h in at.get("html") if 'class="fp-row"' in h.proto.body]
    assert len(rows) == 1 and rows[0].count('class="fp-row"') == 2
    assert rows[0].count('data-pos="0"') == 2  # two rows, aligned by token
    at.radio(key="cmp_mode").set_value("rank_shift").run()
    assert not at.exception and not at.error
    # the Dataset page compares the stored reasoners side by side
    at.switch_page("screens/dataset.py")
    at.session_state[DATASET_TAB_KEY] = "Reasoners"  # a lazy tab: only the open one runs
    at.run()
    assert not at.exception and not at.error
    summary = [d.value for d in at.dataframe if "shifted_ratio" in getattr(d.value, "columns", [])]
    assert summary and sorted(summary[0]["reasoner"]) == ["qwen_base", "qwen_reason"]
    ids = [c.proto.id for c in at.get("plotly_chart")]
    assert any(i.endswith("-ds_fig_reasoners_density") for i in ids), ids
