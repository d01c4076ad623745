"""Verify-ahead decoding (core/decoding/engine.py) gives the lock-step output.

Lock-step (`lookahead=1`) reads one token per model per step; verify-ahead lets the base draft a block
and the reasoner read it in one forward, cropping both caches back at the first changed position.
Every comparison here is token-for-token (ids and sources) and metric-for-metric (≤ 1e-5) against a
lock-step run of the same request, for greedy and sampled decoding, one row and batches of
left-padded rows, with EOS, stop strings and max_new_tokens.
"""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spies import FeedLog

import core
from core.decoding import CACHES
from core.decoding.block_sizing import MAX_LOOKAHEAD, RATE_WINDOW, SIZERS, BlockSizer, SizerMemory
from core.scoring.registry import INT_METRICS, METRICS

PROMPTS = ["What is 2+3?", "Tom has 3 boxes of 4 apples. He gives away 2. How many apples are left?", "x"]
ATOL, RTOL = 1e-5, 1e-6
SIDES = ("base", "reason")

POLICIES = {
    "base_only": lambda: core.BaseOnly(),
    "guided": lambda: core.Guided(tau=2.0, lam=1.0, window=4, max_takeovers=4),
    "guided_lam": lambda: core.Guided(tau=1.0, lam=1.3, window=3),
    "random": lambda: core.RandomPositions(rate=0.15, seed=1),
    "early": lambda: core.EarlyOnly(rate=0.2),
    "forced": lambda: core.Forced({2: 7, 5: "reason", 9: "reason"}),
}


@pytest.fixture()
def pair(qwen_pair) -> core.ModelPair:
    CACHES.clear()
    yield qwen_pair
    CACHES.clear()


@pytest.fixture()
def long_pair(qwen_pair) -> core.ModelPair:
    """The tiny pair without EOS, so that runs reach max_new_tokens and blocks get long."""
    CACHES.clear()
    yield dataclasses.replace(qwen_pair, eos_ids=frozenset())
    CACHES.clear()


def assert_same(got: core.Trace, want: core.Trace) -> None:
    """Token-identical, same sources, every metric within 1e-5 (ints exact), same top-k."""
    np.testing.assert_array_equal(got.token_ids, want.token_ids)
    assert list(got.source) == list(want.source)
    for name in METRICS:
        if name in INT_METRICS:
            np.testing.assert_array_equal(got.metrics[name], want.metrics[name], err_msg=name)
        else:
            np.testing.assert_allclose(got.metrics[name], want.metrics[name], atol=ATOL, rtol=RTOL, err_msg=name)
    for side in SIDES:
        np.testing.assert_allclose(got.topk[side][1], want.topk[side][1], atol=ATOL, rtol=0, err_msg=side)
    assert got.key == want.key  # the request does not depend on the lookahead


def assert_matches_score(pair, trace: core.Trace) -> None:
    """The trace's metrics are those of a teacher-forced `core.score` of its own tokens (an independent path)."""
    ref = core.score(pair, trace.meta["problem"]["prompt"], trace.token_ids.tolist(), k=trace.k)
    for name in METRICS:
        if name in INT_METRICS:
            np.testing.assert_array_equal(trace.metrics[name], ref.metrics[name], err_msg=name)
        else:
            np.testing.assert_allclose(trace.metrics[name], ref.metrics[name], atol=ATOL, rtol=RTOL, err_msg=name)


def run(pair, prompts, policy, lookahead, **kw):
    out = core.generate(pair, prompts, policy, lookahead=lookahead, **kw)
    return out if isinstance(out, list) else [out]


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("batch", [1, 3])
def test_verify_ahead_equals_lock_step(pair, name: str, temperature: float, batch: int) -> None:
    prompts = PROMPTS[1] if batch == 1 else PROMPTS
    samples = 1 if batch == 1 else 2
    kw = {"max_new_tokens": 18, "temperature": temperature, "seed": 3, "samples": samples}
    lock = run(pair, prompts, POLICIES[name](), 1, **kw)
    for lookahead in (None, None, 4):  # the second adaptive run starts with what the first learned (length, cut)
        ahead = run(pair, prompts, POLICIES[name](), lookahead, **kw)
        assert len(ahead) == len(lock) == (1 if batch == 1 else 6)
        for got, want in zip(ahead, lock):
            assert_same(got, want)
    assert_matches_score(pair, ahead[-1])
    if name != "base_only":
        assert any((t.source != "base").any() for t in lock)  # the policy did fire


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_stops_are_the_same(pair, temperature: float) -> None:
    """EOS (the tiny reasoner likes it), a stop string, and max_new_tokens end rows where lock-step does."""
    free = dataclasses.replace(pair, eos_ids=frozenset())
    full = core.generate(free, PROMPTS[1], max_new_tokens=30, temperature=temperature, seed=2, lookahead=1)
    text_at = [free.decode(full.token_ids[: i + 1].tolist()) for i in range(len(full))]
    stop = text_at[12][-2:]
    for policy in (core.BaseOnly(), core.RandomPositions(rate=0.3, seed=5), core.Forced({4: min(pair.eos_ids)})):
        kw = {"max_new_tokens": 30, "temperature": temperature, "seed": 2, "stop": [stop], "samples": 2}
        lock = run(pair, PROMPTS, policy, 1, **kw)
        ahead = run(pair, PROMPTS, policy, None, **kw)
        assert len({len(t) for t in lock}) > 1 or isinstance(policy, core.Forced)  # rows stop at different places
        for got, want in zip(ahead, lock):
            assert_same(got, want)
            ends = got.token_ids[-1] in pair.eos_ids or stop in pair.decode(got.token_ids.tolist()) or len(got) == 30
            assert ends


def test_blocks_really_happen_and_read_each_token_once(long_pair, monkeypatch) -> None:
    """BaseOnly never changes a draft: after warming up the reasoner reads whole blocks in one forward,
    and each model reads every response token exactly once (the last one never)."""
    log = FeedLog(long_pair, monkeypatch)
    trace = core.generate(long_pair, PROMPTS[0], max_new_tokens=64)
    assert len(trace) == 64
    base, reason = log.sizes("base"), log.sizes("reason")
    for side, sizes in (("base", base), ("reason", reason)):
        assert sum(sizes) == len(trace.prompt_ids[side]) + 63
    assert len(reason) < 64 / 4 and max(reason[1:]) >= 8
    assert base[1:] == [1] * 63  # the base drafts one token at a time


def test_a_change_crops_both_caches(long_pair, monkeypatch) -> None:
    """Forced tokens inside a block: the drafts after them are dropped (crop) and re-read, yet the caches
    end exactly as lock-step's: prompt + 39 tokens each, and the trace is the lock-step trace."""
    policy = core.Forced({20: 5, 33: "reason"})
    lock = core.generate(long_pair, PROMPTS[2], policy, max_new_tokens=40, lookahead=1)
    CACHES.clear()
    ahead = core.generate(long_pair, PROMPTS[2], policy, max_new_tokens=40, lookahead=8)
    assert_same(ahead, lock)
    held = CACHES.get(ahead.key)
    for side in SIDES:
        assert held.caches[side].get_seq_length() == len(ahead.prompt_ids[side]) + 39
        assert held.hidden[side].shape[0] == 40
    # the held hidden states predict the trace's own tokens where the base wrote them (greedy)
    logits = long_pair.base.get_output_embeddings()(held.hidden["base"])[:, : long_pair.vocab_size]
    base_rows = ahead.source == "base"
    np.testing.assert_array_equal(logits.argmax(-1).numpy()[base_rows], ahead.token_ids[base_rows])


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_branches_agree_across_lookaheads(pair, temperature: float) -> None:
    parent = core.generate(pair, PROMPTS[1], core.Guided(tau=2.0, lam=1.0, window=4), max_new_tokens=20,
                           temperature=temperature, seed=1, lookahead=1)
    for pos in (0, 7):
        lock = core.branch(pair, parent, pos, policy=core.RandomPositions(rate=0.2, seed=2), lookahead=1)
        ahead = core.branch(pair, parent, pos, policy=core.RandomPositions(rate=0.2, seed=2))
        assert_same(ahead, lock)


def test_lazy_policy_ignores_the_lookahead(long_pair) -> None:
    policy = core.EntropyGated(threshold=1.5, max_takeovers=4)
    a = core.generate(long_pair, PROMPTS, policy, max_new_tokens=20, lookahead=1)
    b = core.generate(long_pair, PROMPTS, policy, max_new_tokens=20)
    for got, want in zip(b, a):
        assert_same(got, want)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["guided", "random", "forced", "early"]), lookahead=st.integers(2, 9),
       temperature=st.sampled_from([0.0, 0.7]), seed=st.integers(0, 50), prompt=st.sampled_from(PROMPTS),
       max_new=st.integers(1, 24))
def test_property_any_lookahead_is_lock_step(qwen_pair, kind, lookahead, temperature, seed, prompt, max_new) -> None:
    pair = dataclasses.replace(qwen_pair, eos_ids=frozenset())
    policy = {
        "guided": core.Guided(tau=1.0 + seed % 3, lam=1.0 + (seed % 4) / 10, window=1 + seed % 5),
        "random": core.RandomPositions(rate=(seed % 5) / 10, seed=seed),
        "forced": core.Forced({seed % 7: "reason", seed % 11: seed % 300}),
        "early": core.EarlyOnly(rate=(seed % 4) / 8),
    }[kind]
    kw = {"max_new_tokens": max_new, "temperature": temperature, "top_p": 0.95 if seed % 2 else 1.0, "seed": seed}
    lock = core.generate(pair, prompt, policy, lookahead=1, **kw)
    ahead = core.generate(pair, prompt, policy, lookahead=lookahead, **kw)
    assert_same(ahead, lock)
    CACHES.clear()


def test_block_size_follows_the_change_rate_and_the_reasoners_cost() -> None:
    sizer = BlockSizer()
    assert 1 < sizer.plan()[0] < 8  # nothing seen yet (q = 1/16) and the reasoner costs one base step
    sizer.add(RATE_WINDOW, False)
    assert sizer.plan()[0] >= MAX_LOOKAHEAD // 2  # no change seen in a long while: long blocks
    for _ in range(RATE_WINDOW // 50):
        sizer.add(50, True)  # one change every 50 positions
    cheap = sizer.plan()[0]
    assert 6 <= cheap < 16  # q = 1/50: n near sqrt(2 c / q) = 10
    for _ in range(40):
        for n in (4, 8, 16):
            sizer.observe(n=n, base_step_s=0.01, verify_s=0.08)  # a pass costs 8 base steps, whatever its length
    assert sizer.plan()[0] > cheap
    for _ in range(40):  # ... but it grows with its length: a wide batch, computing n positions x rows
        for n in (2, 4, 8):
            sizer.observe(n=n, base_step_s=0.01, verify_s=0.01 * (0.5 + 2 * n))
    c0, c1 = sizer.cost()
    assert abs(c0 - 0.5) < 1e-2 and abs(c1 - 2) < 1e-2  # the older points have decayed to ~1e-5 weight
    assert sizer.plan()[0] < cheap
    for _ in range(RATE_WINDOW):
        sizer.add(1, True)  # every position changes: lock-step
    assert sizer.plan()[0] == 1
    with pytest.raises(core.InvalidInputError, match="lookahead"):
        core.generate(None, "x", lookahead=0)


def test_blocks_end_where_the_base_is_unsure_when_changes_fall_there() -> None:
    """Changes that fall only where the base's top-1 probability is low: blocks end at such drafts (the cut) and
    grow as long as allowed elsewhere; changes anywhere (e.g. random takeovers): no cut, the rate alone."""
    sizer, rng = BlockSizer(), np.random.default_rng(0)
    for _ in range(RATE_WINDOW // 32):  # in every 32 positions two unsure ones, one of them a change
        tops = rng.uniform(0.95, 1.0, 32)
        tops[[7, 20]] = (0.85, 0.6)
        sizer.add(8, True, tops[:8])
        sizer.add(24, False, tops[8:])
    n, cut = sizer.plan()
    assert cut == 0.9 and n == MAX_LOOKAHEAD  # 0.9 ends a block at every change and at no sure position
    blind = BlockSizer()
    for _ in range(RATE_WINDOW // 32):  # the same rate of changes, at sure positions
        tops = rng.uniform(0.95, 1.0, 32)
        tops[[7, 20]] = (0.85, 0.6)
        blind.add(12, True, tops[:12])
        blind.add(20, False, tops[12:])
    n_blind, cut_blind = blind.plan()
    assert cut_blind == 0.0 and n_blind < MAX_LOOKAHEAD  # ending at unsure drafts would only add passes
    assert BlockSizer().plan()[1] == 0.0  # nothing seen: no cut


def test_a_learned_cut_drafts_nothing_past_a_change_and_keeps_the_lock_step_output(long_pair, monkeypatch) -> None:
    """Once the sizer has seen where takeovers change the text, blocks end at those drafts: the base drafts
    nothing it must throw away, and the trace is still lock-step's."""
    policy = core.Guided(tau=0.5, lam=1.0, window=4, max_takeovers=3)
    lock = core.generate(long_pair, PROMPTS[1], policy, max_new_tokens=40, lookahead=1)
    changed = [p for p in range(len(lock)) if lock.source[p] == "reason"
               and int(lock.topk["base"][0][p][0]) != int(lock.token_ids[p])]
    assert changed, "the test needs a takeover that changes the text"
    sizer = BlockSizer()
    tops = np.ones(RATE_WINDOW)
    tops[[p % RATE_WINDOW for p in changed]] = 0.5  # seen before: the changes fall where the base is unsure
    sizer.add(RATE_WINDOW, False, tops)
    for p in changed:
        sizer.flags[p] = True
    sizer.changes = len(changed)
    monkeypatch.setattr(SIZERS, "start", lambda *a, **k: sizer)
    log = FeedLog(long_pair, monkeypatch)
    ahead = core.generate(long_pair, PROMPTS[1], policy, max_new_tokens=40)
    assert_same(ahead, lock)
    unsure = [p for p in range(len(lock)) if float(lock.topk["base"][1][p][0]) < sizer.plan()[1]]
    assert sum(log.sizes("base")[1:]) == len(ahead) - 1  # each response token read once: no draft thrown away
    assert len(log.sizes("reason")) - 1 <= len(unsure) + 1 + len(ahead) // MAX_LOOKAHEAD


def test_an_untimed_block_size_follows_the_outputs_alone() -> None:
    """On a GPU (bf16) the schedule must not depend on timings, or a rerun could round differently."""
    timed, untimed = BlockSizer(), BlockSizer(timed=False)
    for sizer in (timed, untimed):
        for _ in range(RATE_WINDOW // 50):
            sizer.add(50, True)
    before = untimed.plan()[0]
    assert before == timed.plan()[0]
    for _ in range(40):
        for sizer in (timed, untimed):
            sizer.observe(n=8, base_step_s=0.01, verify_s=0.08)
    assert untimed.plan()[0] == before and untimed.cost() == (1.0, 0.0)
    assert timed.plan()[0] != before


def test_a_later_run_starts_with_what_verify_ahead_learned(long_pair, monkeypatch) -> None:
    """On a CPU the block sizer outlives its run (`SIZERS`, per pair, policy and batch size): a second short run
    starts with the blocks the first one settled at, so it makes fewer reasoner passes, with the same trace."""
    log = FeedLog(long_pair, monkeypatch)
    policy = core.Forced({})  # never changes a draft: blocks grow as far as the sizer lets them
    first = core.generate(long_pair, PROMPTS[0], policy, max_new_tokens=48)
    one = log.sizes("reason")
    log.calls.clear()
    CACHES.clear()
    again = core.generate(long_pair, PROMPTS[0], policy, max_new_tokens=48)
    two = log.sizes("reason")
    assert_same(again, first)
    assert one[1] < 8 <= two[1]  # the first block: the prior's size, then what 48 unchanged positions taught
    assert len(two) < len(one) and sum(one[1:]) == sum(two[1:]) == 47
    batch = core.generate(long_pair, PROMPTS[:2], policy, max_new_tokens=8)  # another batch size: its own sizer
    assert [len(t) for t in batch] == [8, 8]
    kept = SIZERS.start(long_pair, policy, 1, timed=True)
    assert len(kept.flags) == 2 * 48 and kept.changes == 0  # both runs of one row
    assert len(SIZERS.start(long_pair, core.Guided(), 1, timed=True).flags) == 0  # another policy: a fresh one


def test_the_sizer_memory_keeps_only_timed_sizers_boundedly_while_the_pair_lives(qwen_pair) -> None:
    """Untimed sizers (GPUs: block sizes must follow the run's outputs alone) are never kept; each pair keeps at
    most MAX_KEPT, the most recent; a pair's entries go when the pair does."""
    memory, policy = SizerMemory(), core.BaseOnly()
    pair = dataclasses.replace(qwen_pair)
    untimed = BlockSizer(timed=False)
    untimed.add(RATE_WINDOW, False)
    memory.keep(pair, policy, 1, untimed)
    assert len(memory.start(pair, policy, 1, timed=False).flags) == 0
    for rows in range(1, SizerMemory.MAX_KEPT + 3):
        sizer = BlockSizer()
        sizer.add(rows, False)
        memory.keep(pair, policy, rows, sizer)
    assert len(memory.start(pair, policy, 1, timed=True).flags) == 0  # the oldest two went
    assert len(memory.start(pair, policy, 3, timed=True).flags) == 3
    copy = memory.start(pair, policy, 3, timed=True)
    copy.add(5, True)  # a run's sizer is a copy: the kept one changes only when the run ends
    assert memory.start(pair, policy, 3, timed=True).changes == 0
    assert memory.start(qwen_pair, policy, 3, timed=True).changes == 0 and len(memory._kept) == 1
    del pair, sizer, copy
    gc.collect()
    assert memory._kept == {}


def test_base_only_reads_the_reasoner_after_the_run(long_pair, monkeypatch) -> None:
    """BaseOnly decides nothing per step: with an adaptive lookahead the reasoner reads the response in one
    teacher-forced pass at the end (or one per flush), and the metrics it fills per block are lock-step's."""
    import core.decoding.engine as engine

    log = FeedLog(long_pair, monkeypatch)
    trace = core.generate(long_pair, PROMPTS[1], max_new_tokens=20)
    assert log.sizes("reason") == [len(trace.prompt_ids["reason"]), 19]
    assert log.sizes("base") == [len(trace.prompt_ids["base"])] + [1] * 19
    monkeypatch.setattr(engine, "LAZY_FLUSH", 6)  # blocks of 6 positions: the same numbers as one block
    log.calls.clear()
    kw = {"max_new_tokens": 20, "temperature": 0.9, "seed": 4, "samples": 2}
    flushed = run(long_pair, PROMPTS[:2], core.BaseOnly(), None, **kw)
    assert log.sizes("reason")[1:] == [5, 6, 6, 2]  # each flush reads up to its last position (19 never)
    for got, want in zip(flushed, run(long_pair, PROMPTS[:2], core.BaseOnly(), 1, **kw)):
        assert_same(got, want)
    assert_matches_score(long_pair, flushed[-1])


def test_drafts_stop_at_the_end_of_sequence(long_pair, monkeypatch) -> None:
    """A block stops drafting at a drafted end of sequence: nothing after it is fed to either model (each
    reads every token once, the last never), and the trace is lock-step's."""
    free = core.generate(long_pair, PROMPTS[1], max_new_tokens=30, lookahead=1)
    ids = free.token_ids.tolist()
    # an end token first drawn inside a block of 8 (not at its last position, where drafting stops anyway)
    end = next(p for p in range(9, 30) if ids[p] not in ids[:p] and p % 8 != 7)
    pair = dataclasses.replace(long_pair, eos_ids=frozenset({ids[end]}))
    never = core.Guided(tau=1e9, lam=1.0, window=4)  # verify-ahead blocks, no takeover
    log = FeedLog(pair, monkeypatch)
    ahead = core.generate(pair, PROMPTS[1], never, max_new_tokens=30, lookahead=8)
    assert len(ahead) == end + 1 and ahead.token_ids[-1] == ids[end]
    for side in SIDES:
        assert sum(log.sizes(side)) == len(ahead.prompt_ids[side]) + end
    assert max(log.sizes("reason")[1:]) == 7  # blocks did happen (the first reads 7 drafts after the prompt)
    assert_same(ahead, core.generate(pair, PROMPTS[1], never, max_new_tokens=30, lookahead=1))
