"""core.decoding: the dual-model engine against independent references (plain HF forwards, `core.score`).

Every generated or branched trace is re-scored teacher-forced with `core.score`; greedy tokens are
checked against argmaxes of full-prefix forwards; KV-cache reuse is checked by recording what each
backbone call is fed.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np
import pytest
import torch
from spies import FeedLog

import core
from core.decoding import (
    CACHES,
    CacheLRU,
    HeldCaches,
    Sampling,
    base_rollouts,
    generate_many,
    has_base_rollouts,
    sample_token,
)
from core.decoding.engine import Decoder
from core.decoding.generation import make_rows
from core.errors import GenerationCancelled
from core.scoring.registry import INT_METRICS, METRICS

SIDES = ("base", "reason")
PROMPTS = ["What is 2+3?", "Tom has 3 boxes of 4 apples. He gives away 2. How many apples are left?", "x"]
RAW = "Question: {problem}\nAnswer:"

# Tolerance of generate/branch metrics against `core.score` on the same text. Both run float32 but
# through different kernels (one cached query row per step vs one full-sequence forward), so logits
# differ by a few ulp of their magnitude (|logit| ≲ 13 and |log p| ≲ 25 nats for these tiny models,
# whose heads are scaled ×20): ulp(16) ≈ 2e-6, and a metric sums a few such terms. Hence
# |gen - score| ≤ 1e-5 + 1e-6·|score|; on 24 sampled runs of 64 tokens the worst error is < 0.5 of it.
ATOL, RTOL = 1e-5, 1e-6



@pytest.fixture()
def pair(qwen_pair) -> core.ModelPair:
    CACHES.clear()
    yield qwen_pair
    CACHES.clear()


# -- references -------------------------------------------------------------------------------------


def assert_matches_score(pair: core.ModelPair, trace: core.Trace) -> None:
    """`trace`'s metrics and top-k equal a teacher-forced `core.score` of its own tokens."""
    ref = core.score(pair, trace.meta["problem"]["prompt"], trace.token_ids.tolist(), k=trace.k or 10)
    assert ref.prompt_ids == trace.prompt_ids
    for name in METRICS:
        got, want = trace.metrics[name], ref.metrics[name]
        if name in INT_METRICS:
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            np.testing.assert_allclose(got.astype(np.float64), want, atol=ATOL, rtol=RTOL, err_msg=name)
    for side in SIDES:
        ids, probs = trace.topk[side]
        ref_ids, ref_probs = ref.topk[side]
        np.testing.assert_allclose(probs, ref_probs, atol=ATOL, rtol=0, err_msg=f"topk_{side}")
        # ids may swap only between near-tied probabilities (float32 rounding decides the order)
        for t, j in zip(*np.nonzero(ids != ref_ids)):
            alt = np.flatnonzero(ref_ids[t] == ids[t, j])
            assert alt.size and abs(ref_probs[t, alt[0]] - probs[t, j]) <= ATOL, f"topk_{side} ids differ at {t}"


def hf_argmax(model, ids: list[int], vocab: int) -> int:
    """Greedy next token from a plain HF forward of the whole sequence (no cache, no core code)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1, :vocab]
    return int(torch.argmax(logits))


def assert_greedy(pair: core.ModelPair, trace: core.Trace) -> None:
    """Every token is the argmax of the emitting model (base or reason) given its prompt + the prefix."""
    ids = trace.token_ids.tolist()
    for t, src in enumerate(trace.source):
        if src == "forced":
            continue
        want = hf_argmax(pair.model(src), trace.prompt_ids[src] + ids[:t], pair.vocab_size)
        assert ids[t] == want, f"token {t} ({src}): {ids[t]} != argmax {want}"


def held_tensors(held: HeldCaches) -> list[torch.Tensor]:
    kv = [t for c in held.caches.values() for layer in c.layers for t in (layer.keys, layer.values)]
    return kv + list(held.hidden.values())


def snapshot(held: HeldCaches) -> list[torch.Tensor]:
    return [t.clone() for t in held_tensors(held)]


def same_tensors(held: HeldCaches, snap: list[torch.Tensor]) -> bool:
    now = held_tensors(held)
    return len(now) == len(snap) and all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(now, snap))


# -- generate ---------------------------------------------------------------------------------------


POLICIES = {
    "base_only": lambda: core.BaseOnly(),
    "reason_only": lambda: core.ReasonOnly(),
    "guided": lambda: core.Guided(tau=2.0, lam=1.0, window=4, budget=0.3),
    "entropy_gated": lambda: core.EntropyGated(threshold=1.5, budget=0.3),
    "random": lambda: core.RandomPositions(rate=0.3, seed=1),
    "early": lambda: core.EarlyOnly(rate=0.25),
    "forced": lambda: core.Forced({1: 7, 3: "reason"}),
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_generated_metrics_equal_score_of_the_text(pair, name: str) -> None:
    policy = POLICIES[name]()
    traces = core.generate(pair, PROMPTS[:2], policy, max_new_tokens=14, temperature=0.9, seed=5, samples=1)
    ref_cols = list(core.score(pair, PROMPTS[0], "abc").frame().columns)
    for trace in traces:
        assert trace.meta["kind"] == "generate"
        assert len(trace) == 14 or (len(trace) < 14 and trace.token_ids[-1] in pair.eos_ids)
        assert list(trace.frame().columns) == ref_cols  # same per-token columns as score, incl. source
        assert set(trace.source) <= {"base", "reason", "forced"}
        assert trace.meta["policy"] == policy.record()
        assert trace.prompt_ids == pair.prompt_ids(trace.meta["problem"]["prompt"])
        assert_matches_score(pair, trace)
    if name != "base_only":
        assert any((t.source != "base").any() for t in traces)


def test_each_model_has_its_own_prompt(pair) -> None:
    trace = core.generate(pair, PROMPTS[0], max_new_tokens=3)
    base_text = pair.decode(trace.prompt_ids["base"])
    reason_text = pair.decode(trace.prompt_ids["reason"])
    assert base_text == RAW.format(problem=PROMPTS[0])
    assert reason_text.startswith("<|im_start|>user\n" + PROMPTS[0]) and reason_text.endswith("assistant\n")


def test_greedy_is_exact_argmax(pair) -> None:
    assert_greedy(pair, core.generate(pair, PROMPTS[1], max_new_tokens=12))
    assert_greedy(pair, core.generate(pair, PROMPTS[0], core.RandomPositions(rate=0.5, seed=3), max_new_tokens=12))


def test_sampling_is_seeded_and_reproducible(pair) -> None:
    run = lambda seed: core.generate(pair, PROMPTS[0], max_new_tokens=16, temperature=1.0, seed=seed)
    a, b, c = run(3), run(3), run(4)
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    assert a.key == b.key and a.key != c.key
    assert not np.array_equal(a.token_ids, c.token_ids)
    assert a.meta["sampling"] == {"temperature": 1.0, "top_p": 1.0, "seed": 3, "sample": 0,
                                  "max_new_tokens": 16, "stop": []}


def test_sample_token_rules() -> None:
    logits = torch.tensor([0.0, 3.0, 2.9, -1.0])
    assert sample_token(logits, 0.0, 1.0, None) == 1
    gen = lambda: torch.Generator().manual_seed(0)
    # a tiny nucleus keeps only the top token, whatever the stream says
    assert {sample_token(logits, 5.0, 0.01, torch.Generator().manual_seed(s)) for s in range(20)} == {1}
    assert sample_token(logits, 1.0, 1.0, gen()) == sample_token(logits, 1.0, 1.0, gen())
    draws = [sample_token(logits, 1.0, 0.9, torch.Generator().manual_seed(s)) for s in range(200)]
    assert set(draws) == {1, 2}  # p = .50/.45/.05(0)/...: the nucleus of 0.9 is {1, 2}


def test_stops_on_eos_max_tokens_and_stop_strings(pair) -> None:
    eos = min(pair.eos_ids)
    trace = core.generate(pair, PROMPTS, core.Forced({3: eos}), max_new_tokens=10)
    for t in trace:
        assert len(t) == 4 and t.token_ids[3] == eos and t.source[3] == "forced"
    assert len(core.generate(pair, PROMPTS[0], max_new_tokens=7)) == 7
    full = core.generate(pair, PROMPTS[1], max_new_tokens=24)
    text_at = [pair.decode(full.token_ids[: i + 1].tolist()) for i in range(len(full))]
    stop = text_at[9][-3:]  # a string first completed somewhere in the first 10 tokens
    first = next(i for i, s in enumerate(text_at) if stop in s)
    stopped = core.generate(pair, PROMPTS[1], max_new_tokens=24, stop=[stop])
    assert len(stopped) == first + 1
    np.testing.assert_array_equal(stopped.token_ids, full.token_ids[: first + 1])
    assert stopped.meta["sampling"]["stop"] == [stop]
    if len(set(stop)) > 1:  # one string is one stop string, not its characters
        as_text = core.generate(pair, PROMPTS[1], max_new_tokens=24, stop=stop)
        np.testing.assert_array_equal(as_text.token_ids, stopped.token_ids)
        assert as_text.meta["sampling"]["stop"] == [stop]
    with pytest.raises(core.InvalidInputError, match="stop strings"):
        core.generate(pair, PROMPTS[1], max_new_tokens=4, stop=[""])


def test_batched_rows_equal_rows_alone(pair) -> None:
    lengths = {len(pair.prompt_ids(p)["base"]) for p in PROMPTS}
    assert len(lengths) == 3  # left padding really happens
    batch = core.generate(pair, PROMPTS, max_new_tokens=12, samples=2)
    assert len(batch) == 6 and [t.meta["problem"]["prompt"] for t in batch] == [p for p in PROMPTS for _ in (0, 1)]
    for i, p in enumerate(PROMPTS):
        alone = core.generate(pair, p, max_new_tokens=12)
        for trace in batch[2 * i: 2 * i + 2]:  # greedy: both samples are the same
            np.testing.assert_array_equal(trace.token_ids, alone.token_ids)
            assert_matches_score(pair, trace)
        assert_greedy(pair, batch[2 * i])


def _alone(pair, prompt, sample: int, sampling: Sampling, policy=None) -> list[int]:
    """Run one (prompt, sample) row through the engine by itself."""
    rows = make_rows(pair, [prompt], 1, policy or core.BaseOnly(), sampling, 10, first_sample=sample)
    Decoder(pair, rows, policy or core.BaseOnly(), sampling, 10).run()
    return rows[0].tokens


def test_sampled_rows_are_the_same_alone_or_batched(pair) -> None:
    """Same seed + sample index -> same tokens. Left padding only perturbs logits by float rounding, so
    this holds unless a draw lands within ~1e-6 of a cumulative-probability boundary."""
    batch = core.generate(pair, PROMPTS, max_new_tokens=12, samples=3, temperature=0.8, seed=11)
    sampling = Sampling(temperature=0.8, seed=11, max_new_tokens=12)
    for i, p in enumerate(PROMPTS):
        rows = batch[3 * i: 3 * i + 3]
        assert [t.meta["sampling"]["sample"] for t in rows] == [0, 1, 2]
        assert len({tuple(t.token_ids) for t in rows}) > 1  # samples differ from each other
        for s, trace in enumerate(rows):
            assert trace.token_ids.tolist() == _alone(pair, p, s, sampling)
            assert_matches_score(pair, trace)


# -- KV caches: nothing is read twice --------------------------------------------------------------


def test_lock_step_feeds_one_token_per_model_per_step(pair, monkeypatch) -> None:
    log = FeedLog(pair, monkeypatch)
    trace = core.generate(pair, PROMPTS[0], max_new_tokens=10, lookahead=1)
    for side in SIDES:
        assert log.sizes(side) == [len(trace.prompt_ids[side])] + [1] * 9
    log.calls.clear()
    batch = core.generate(pair, PROMPTS, max_new_tokens=6, lookahead=1)
    for side in SIDES:
        assert log.sizes(side) == [max(len(t.prompt_ids[side]) for t in batch)] + [1] * 5


def test_entropy_gated_runs_the_reasoner_lazily(pair, monkeypatch) -> None:
    pair = dataclasses.replace(pair, eos_ids=frozenset())  # the random reasoner likes EOS: run all 24 tokens
    log = FeedLog(pair, monkeypatch)
    policy = core.EntropyGated(threshold=1.5, max_takeovers=5)
    trace = core.generate(pair, PROMPTS[1], policy, max_new_tokens=24)
    n_taken = int((trace.source == "reason").sum())
    assert 0 < n_taken < len(trace) - 2
    base, reason = log.sizes("base"), log.sizes("reason")
    assert base == [len(trace.prompt_ids["base"])] + [1] * (len(trace) - 1)
    # the reasoner reads every token exactly once, but in fewer, larger catch-up forwards
    assert sum(reason) == len(trace.prompt_ids["reason"]) + len(trace) - 1
    assert len(reason) < len(base) and max(reason[1:]) > 1
    assert_matches_score(pair, trace)  # the skipped positions were filled in afterwards


# -- branching --------------------------------------------------------------------------------------


def test_branch_takes_the_reasoners_greedy_token(pair) -> None:
    parent = core.generate(pair, PROMPTS[1], max_new_tokens=14)
    for pos in (0, 5, 13):
        child = core.branch(pair, parent, pos)
        ids = child.token_ids.tolist()
        assert ids[:pos] == parent.token_ids[:pos].tolist()
        assert list(child.source[:pos]) == list(parent.source[:pos]) and child.source[pos] == "reason"
        want = hf_argmax(pair.reason, parent.prompt_ids["reason"] + ids[:pos], pair.vocab_size)
        assert ids[pos] == want
        assert_greedy(pair, child)
        assert child.meta["parent"] == parent.key and child.meta["branch_pos"] == pos
        assert child.meta["kind"] == "branch" and child.key != parent.key
        assert child.meta["switches"] == {str(pos): "reason"} == child.meta["policy"]["switches"]
        assert child.meta["switched"] == [{"pos": pos, "to": "reason", "token": None, "from": parent.source[pos] if pos < len(parent) else None}]
        assert len(child) == 14
        assert_matches_score(pair, child)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_branch_with_the_parents_own_token_reproduces_it(pair, temperature: float) -> None:
    parent = core.generate(pair, PROMPTS[0], max_new_tokens=16, temperature=temperature, seed=2)
    from core.decoding.takeover import _child, child_sampling, decode_children

    for pos in (0, 6):
        # no token changes, so core gives the parent itself (issue 31) ...
        assert core.branch(pair, parent, pos, token=int(parent.token_ids[pos])) is parent
        # ... and decoding the child anyway reproduces it, forced token and all
        then, sampling = core.BaseOnly(), child_sampling(parent, pos=pos)
        child = decode_children(pair, parent, [_child(pair, parent, pos, {pos: int(parent.token_ids[pos])}, then,
                                                      sampling)], then, sampling)[0]
        np.testing.assert_array_equal(child.token_ids, parent.token_ids)
        assert child.source[pos] == "forced" and (np.delete(child.source, pos) == "base").all()
        for name in METRICS:
            np.testing.assert_allclose(child.metrics[name], parent.metrics[name], atol=ATOL, rtol=RTOL)
        assert child.meta["sampling"] == parent.meta["sampling"]


def test_branch_of_a_later_sample_replays_its_stream(pair) -> None:
    rows = core.generate(pair, PROMPTS[0], max_new_tokens=12, samples=2, temperature=0.9, seed=4)
    child = core.branch(pair, rows[1], 5, token=int(rows[1].token_ids[5]))
    np.testing.assert_array_equal(child.token_ids, rows[1].token_ids)


def test_branch_with_and_without_held_caches_agree(pair, monkeypatch) -> None:
    """Held caches: the parent's state at pos already predicts token pos, so no forward runs before the
    first new token (one 1-token read per model when branching at the very end, whose last token was
    never fed); then one token per model per step. Without them: one prefill of prompt + prefix."""
    for temperature, pos in ((0.0, 9), (0.9, 9), (0.0, 16)):
        CACHES.clear()
        parent = core.generate(pair, PROMPTS[1], max_new_tokens=16, temperature=temperature, seed=9)
        assert len(parent) == 16 and CACHES.get(parent.key) is not None
        log = FeedLog(pair, monkeypatch)
        first_new = []
        warm = core.branch(pair, parent, pos, max_new_tokens=20, lookahead=1,
                           progress=lambda t, n: first_new.append(len(log.calls)))
        before_first = log.calls[: first_new[0]]
        assert sorted(before_first) == ([] if pos < 16 else [("base", 1), ("reason", 1)])
        assert all(n == 1 for _, n in log.calls)
        assert len(log.calls) == 2 * (len(warm) - pos - 1 + (pos == 16))  # the last token is never fed
        CACHES.clear()
        log.calls.clear()
        cold = core.branch(pair, parent, pos, max_new_tokens=20)
        assert sorted(log.calls[:2]) == sorted((s, len(parent.prompt_ids[s]) + pos) for s in SIDES)
        np.testing.assert_array_equal(warm.token_ids, cold.token_ids)
        assert list(warm.source) == list(cold.source) and warm.key == cold.key
        for name in METRICS:
            np.testing.assert_allclose(warm.metrics[name], cold.metrics[name], atol=ATOL, rtol=RTOL)
        assert_matches_score(pair, warm)
        # the cold child is held too, with its prefix's states: its own branches need no forward either
        log.calls.clear()
        first_new.clear()
        core.branch(pair, cold, pos + 2, max_new_tokens=pos + 3, lookahead=1, progress=lambda t, n: first_new.append(len(log.calls)))
        assert first_new[0] == 0


def test_branch_of_a_branch_and_of_a_scored_trace(pair) -> None:
    parent = core.generate(pair, PROMPTS[0], max_new_tokens=12)
    child = core.branch(pair, parent, 4)
    grandchild = core.branch(pair, child, 8, policy=core.EntropyGated(threshold=1.0, budget=0.5))
    assert grandchild.token_ids[:8].tolist() == child.token_ids[:8].tolist()
    assert grandchild.meta["parent"] == child.key
    assert child.source[4] == grandchild.source[4] == "reason"
    assert_matches_score(pair, grandchild)
    scored = core.score(pair, PROMPTS[0], "The answer is 5. Wait, check it.")
    forked = core.branch(pair, scored, 3, max_new_tokens=10)
    assert forked.token_ids[:3].tolist() == scored.token_ids[:3].tolist() and len(forked) == 10
    assert_matches_score(pair, forked)


def test_guided_branch_sees_the_prefix_history(pair) -> None:
    """A Guided branch with the parent's own token continues exactly as the Guided parent did (the gate's
    running mean covers the inherited prefix)."""
    policy = core.Guided(tau=2.0, lam=1.2, window=3, budget=1.0)
    parent = core.generate(pair, PROMPTS[1], policy, max_new_tokens=20)
    pos = 5
    assert parent.source[pos] == "base" and (parent.source[pos + 1:] == "reason").any()
    child = core.branch(pair, parent, pos, token=int(parent.token_ids[pos]), policy=policy)
    np.testing.assert_array_equal(child.token_ids, parent.token_ids)
    assert list(np.delete(child.source, pos)) == list(np.delete(parent.source, pos))


def test_held_caches_are_never_mutated_by_branches(pair) -> None:
    parent = core.generate(pair, PROMPTS[0], max_new_tokens=12)
    held = CACHES.get(parent.key)
    assert held.n_tokens == 11 and held.prompt_len == {s: len(parent.prompt_ids[s]) for s in SIDES}
    from transformers import DynamicCache

    assert held.caches["base"] is not held.caches["reason"]
    for s in SIDES:  # each model's own cache: its own prompt + the 11 response tokens fed so far
        assert isinstance(held.caches[s], DynamicCache)
        assert held.caches[s].get_seq_length() == len(parent.prompt_ids[s]) + 11
        assert held.hidden[s].shape == (12, pair.model(s).config.hidden_size)
    # hidden[r] predicts token r: the greedy base parent's tokens are the argmaxes of its head
    logits = pair.base.get_output_embeddings()(held.hidden["base"])[:, : pair.vocab_size]
    np.testing.assert_array_equal(logits.argmax(-1).numpy(), parent.token_ids)
    snap = snapshot(held)
    for pos in (0, 3, 11, 12):
        core.branch(pair, parent, pos, max_new_tokens=14)
    assert CACHES.get(parent.key) is held and same_tensors(held, snap)


# -- the LRU ----------------------------------------------------------------------------------------


def test_cache_lru_is_bounded_in_bytes(pair, caplog) -> None:
    traces = [core.generate(pair, p, max_new_tokens=6) for p in PROMPTS[:2]] + \
        [core.generate(pair, PROMPTS[0], max_new_tokens=6, seed=1, temperature=0.5)]
    helds = [CACHES.get(t.key) for t in traces]
    sizes = [h.nbytes() for h in helds]
    cfg = pair.base.config
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4  # K and V, float32
    states = 2 * 6 * cfg.hidden_size * 4  # each model's final hidden states predicting tokens 0 .. 5
    assert sizes[0] == per_token * sum(len(traces[0].prompt_ids[s]) + 5 for s in SIDES) + states
    lru = CacheLRU(max_bytes=sizes[0] + sizes[1] + sizes[2] - 1)
    for t, h in zip(traces, helds):
        lru.put(t.key, h)
    assert len(lru) == 2 and lru.get(traces[0].key) is None  # the oldest went first
    assert lru.get(traces[1].key) is helds[1]  # touching it makes traces[2] the oldest
    lru.put(traces[0].key, helds[0])
    assert lru.get(traces[2].key) is None and lru.get(traces[1].key) is helds[1]
    tiny = CacheLRU(max_bytes=1)
    with caplog.at_level(logging.WARNING, logger="core.decoding.caches"):
        tiny.put("k", helds[0])
    assert len(tiny) == 0 and tiny.get("k") is None and tiny.get(None) is None
    assert "not holding the KV caches of trace k" in caplog.text and "re-reads its prefix" in caplog.text
    assert CacheLRU().limit(torch.device("cpu")) == 1 << 30  # the default on a CPU


# -- bad input and interruptions ------------------------------------------------------------------


def test_bad_input_gives_clear_errors(pair, tiny_dirs) -> None:
    parent = core.generate(pair, PROMPTS[0], max_new_tokens=6)
    for pos in (-1, 7, 2.0):
        with pytest.raises(core.InvalidInputError, match="outside the trace"):
            core.branch(pair, parent, pos)
    for token in (-1, pair.vocab_size):
        with pytest.raises(core.InvalidInputError, match="outside the vocabulary"):
            core.branch(pair, parent, 2, token=token)
    with pytest.raises(core.InvalidInputError, match="outside the vocabulary"):
        core.generate(pair, PROMPTS[0], core.Forced({1: pair.vocab_size + 3}), max_new_tokens=4)
    for budget in (-0.1, 1.5, float("nan")):
        with pytest.raises(core.InvalidInputError, match="budget"):
            core.Guided(budget=budget)
        with pytest.raises(core.InvalidInputError, match="budget"):
            core.EntropyGated(budget=budget)
    for kwargs, match in [({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
                          ({"max_new_tokens": 0}, "max_new_tokens"), ({"samples": 0}, "samples")]:
        with pytest.raises(core.InvalidInputError, match=match):
            core.generate(pair, PROMPTS[0], **{"max_new_tokens": 4, **kwargs})
    other = core.load_pair(str(tiny_dirs["qwen_base"]), str(tiny_dirs["qwen_reason"]), device="cpu",
                           dtype="float32", reason_format=RAW)
    with pytest.raises(core.PairMismatchError, match="different model pair"):
        core.branch(other, parent, 2)
    with pytest.raises(core.InvalidInputError, match="max_new_tokens"):
        core.branch(pair, parent, 6, max_new_tokens=6)


class Stop(Exception):
    pass


def _interrupter(at: int, exc: type[BaseException]):
    def progress(t: int, limit: int) -> None:
        if t >= at:
            raise exc()
    return progress


def test_interrupted_generation_leaves_the_lru_intact(pair) -> None:
    parent = core.generate(pair, PROMPTS[1], max_new_tokens=14, temperature=0.7, seed=1)
    reference = core.branch(pair, parent, 5)
    keys = [parent.key, reference.key]
    helds = [CACHES.get(k) for k in keys]
    snaps = [snapshot(h) for h in helds]
    calls = iter(range(100))
    with pytest.raises(KeyboardInterrupt):
        core.branch(pair, parent, 3, progress=_interrupter(6, KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        core.generate(pair, PROMPTS[0], max_new_tokens=10, progress=_interrupter(3, KeyboardInterrupt))
    with pytest.raises(GenerationCancelled):
        core.branch(pair, parent, 2, should_stop=lambda: next(calls) >= 3)
    with pytest.raises(GenerationCancelled):
        core.generate(pair, PROMPTS, max_new_tokens=10, should_stop=lambda: True)
    with pytest.raises(GenerationCancelled):
        core.generate(pair, PROMPTS[2], core.EntropyGated(threshold=0.5), max_new_tokens=10,
                      should_stop=lambda: next(calls) >= 10)
    assert isinstance(GenerationCancelled("x"), core.ForkpointError)
    assert len(CACHES) == 2 and [CACHES.get(k) for k in keys] == helds
    assert all(same_tensors(h, s) for h, s in zip(helds, snaps))
    again = core.branch(pair, parent, 5)
    np.testing.assert_array_equal(again.token_ids, reference.token_ids)
    for name in METRICS:
        np.testing.assert_allclose(again.metrics[name], reference.metrics[name], atol=ATOL, rtol=RTOL)


# -- calibration ------------------------------------------------------------------------------------


def test_calibrate_fits_the_gate_on_base_rollouts(pair) -> None:
    gate = core.calibrate(pair, PROMPTS, ratio=0.1, window=5, max_new_tokens=12, batch_size=2)
    rollouts = core.generate(pair, PROMPTS, core.BaseOnly(), max_new_tokens=12)
    pooled = np.concatenate([t.metrics["cross_entropy"].astype(np.float64) for t in rollouts])
    tau = np.quantile(pooled, 0.9)
    assert gate.window == 5
    assert math.isclose(gate.tau, tau, rel_tol=5e-6)  # fitted values are rounded to 6 significant digits
    assert math.isclose(gate.lam, pooled[pooled > tau].mean() / pooled.mean(), rel_tol=5e-6)
    with pytest.raises(core.InvalidInputError):
        core.calibrate(pair, [], ratio=0.1)
    with pytest.raises(core.InvalidInputError, match="score"):
        core.calibrate(pair, PROMPTS, score="kll")


# -- one path for batches of generations, and calibration keyed by the pair -------------------------


def test_generate_many_batches_progress_store_and_hook(pair, tmp_path) -> None:
    store = core.TraceStore(tmp_path / "store")
    seen, ticks = [], []

    def grade(trace: core.Trace) -> None:
        seen.append(trace.key)
        trace.meta["correct"] = trace.meta.get("correct") is None or trace.meta["correct"]

    traces = generate_many(pair, PROMPTS, core.BaseOnly(), samples=2, batch_size=2, max_new_tokens=6,
                           temperature=0.7, seed=3, store=store, on_trace=grade,
                           progress=lambda done, total: ticks.append((done, total)))
    assert [t.meta["problem"]["prompt"] for t in traces] == [p for p in PROMPTS for _ in (0, 1)]
    assert [t.meta["sampling"]["sample"] for t in traces] == [0, 1] * 3
    one_batch = core.generate(pair, PROMPTS, core.BaseOnly(), samples=2, max_new_tokens=6, temperature=0.7, seed=3)
    for got, want in zip(traces, one_batch):
        np.testing.assert_array_equal(got.token_ids, want.token_ids)
        assert got.key == want.key
    assert seen == [t.key for t in traces] and all(store.get(t.key).meta["correct"] is True for t in traces)
    assert ticks[-1] == (6, 6) and [d for d, _ in ticks] == sorted(d for d, _ in ticks)
    assert any(0 < d < 4 for d, _ in ticks)  # progress inside the first batch, not only after it
    # stored traces go through the hook; a changed meta is re-written, an unchanged one is not
    mtimes = {t.key: (tmp_path / "store" / "traces" / f"{t.key}.parquet").stat().st_mtime_ns for t in traces}
    again = generate_many(pair, PROMPTS[:1], core.BaseOnly(), samples=2, max_new_tokens=6, temperature=0.7,
                          seed=3, store=store, on_trace=lambda t: t.meta.update(answer="42"))
    assert all(store.get(t.key).meta["answer"] == "42" for t in again)
    generate_many(pair, PROMPTS[1:2], core.BaseOnly(), samples=2, max_new_tokens=6, temperature=0.7, seed=3,
                  store=store, on_trace=lambda t: None)
    for t in traces[2:4]:
        assert (tmp_path / "store" / "traces" / f"{t.key}.parquet").stat().st_mtime_ns == mtimes[t.key]


def test_calibrate_from_the_store_uses_only_this_pairs_rollouts(pair, llama_pair, tmp_path) -> None:
    store = core.TraceStore(tmp_path / "store")
    assert not has_base_rollouts(pair, store)
    with pytest.raises(core.InvalidInputError, match="No base rollouts of this model pair"):
        core.calibrate(pair, store=store)
    core.generate(llama_pair, PROMPTS, core.BaseOnly(), max_new_tokens=12, store=store)  # another pair's
    core.generate(pair, PROMPTS[0], core.Forced({1: "reason"}), max_new_tokens=12, store=store)  # not BaseOnly
    assert not has_base_rollouts(pair, store) and has_base_rollouts(llama_pair, store)
    with pytest.raises(core.InvalidInputError, match="No base rollouts"):
        core.calibrate(pair, store=store)
    listed = store.keys()
    made = core.calibrate(pair, PROMPTS[:2], ratio=0.1, window=5, max_new_tokens=12, store=store)
    assert has_base_rollouts(pair, store) and len(base_rollouts(pair, store)) == 2
    # the rollouts are kept apart from the user's traces (never listed with them), and reused next time
    rollouts = store.calibration_store()
    assert store.keys() == listed and len(rollouts.keys()) == 2 and rollouts.n_written == 2
    assert sorted(t.key for t in base_rollouts(pair, store)) == sorted(rollouts.keys())
    again = core.calibrate(pair, PROMPTS[:2], ratio=0.1, window=5, max_new_tokens=12, store=store)
    assert again == made and rollouts.n_written == 2 and store.keys() == listed
    # a store from before the calibration store holds the same rollouts among the user's traces: each counts once
    for key in rollouts.keys():
        store.put(rollouts.get(key))
    assert len(base_rollouts(pair, store)) == 2 and core.calibrate(pair, ratio=0.1, window=5, store=store) == made
    from_store = core.calibrate(pair, ratio=0.1, window=5, store=store)
    assert from_store.window == made.window and math.isclose(from_store.tau, made.tau, rel_tol=1e-9)
    assert math.isclose(from_store.lam, made.lam, rel_tol=1e-9)
    theirs = core.calibrate(llama_pair, ratio=0.1, window=5, store=store)
    pooled = np.concatenate([t.metrics["cross_entropy"].astype(np.float64) for t in base_rollouts(llama_pair, store)])
    assert len(base_rollouts(llama_pair, store)) == 3 and math.isclose(theirs.tau, np.quantile(pooled, 0.9), rel_tol=5e-6)
    assert theirs != made


def test_sliding_window_models_decode_crop_and_branch(tmp_path, tiny_tokenizer) -> None:
    """A model with sliding-window layers (Mistral, Gemma, Qwen2 with the window on): verify-ahead crops
    and branches reach back past the window (transformers' sliding cache layer refuses that), and every
    number equals an eager Hugging Face forward that applies the window."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    for side, seed in (("base", 0), ("reason", 1)):
        torch.manual_seed(seed)
        config = Qwen3Config(vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                             eos_token_id=0, pad_token_id=0, bos_token_id=None, tie_word_embeddings=False,
                             use_sliding_window=True, sliding_window=8, max_window_layers=0,
                             layer_types=["sliding_attention", "full_attention"])
        model = AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(20.0)
        model.save_pretrained(tmp_path / side)
        tiny_tokenizer.save_pretrained(tmp_path / side)
    pair = core.load_pair(str(tmp_path / "base"), str(tmp_path / "reason"), device="cpu", dtype="float32")
    policy = core.RandomPositions(rate=0.3, seed=1)
    ahead = core.generate(pair, PROMPTS[0], policy, max_new_tokens=40)
    lock = core.generate(pair, PROMPTS[0], policy, max_new_tokens=40, lookahead=1)
    np.testing.assert_array_equal(ahead.token_ids, lock.token_ids)
    assert (ahead.source != "base").any()
    assert_matches_score(pair, ahead)
    child = core.branch(pair, ahead, pos=30)  # 30 positions back from the end is far past the 8-token window
    assert_matches_score(pair, child)
    eager = AutoModelForCausalLM.from_pretrained(tmp_path / "base", attn_implementation="eager").eval()
    ids = pair.prompt_ids(PROMPTS[0])["base"] + ahead.token_ids.tolist()
    with torch.no_grad():
        logp = eager(torch.tensor([ids])).logits[0, len(ids) - len(ahead) - 1 : -1].double().log_softmax(-1)
    np.testing.assert_allclose(ahead.metrics["entropy_base"], -(logp.exp() * logp).sum(-1).numpy(), atol=1e-5)
