"""Long chains of thought: a 3,072-token response from a one-layer pair on CPU.

The engine's work per token must not grow with the response beyond attention's (no O(T²) Python:
no per-step list copies, history slicing or re-decoding), its memory must grow only with the KV cache
and the per-token record, and the metrics of a long generated trace must still be those of a
teacher-forced `core.score` of its text.
"""

from __future__ import annotations

import dataclasses
import resource
import time

import numpy as np
import pytest

import core
from core.decoding import CACHES
from core.demo.tiny import build_tiny_model
from core.scoring.registry import INT_METRICS

T = 3072  # long enough that an O(T) step (a re-decode, a history copy) would dominate the per-token cost
PROMPT = "Tom has 3 boxes of 4 apples. He gives away 2. How many apples are left?"


@pytest.fixture(scope="module")
def long_pair(tmp_path_factory, tiny_tokenizer) -> core.ModelPair:
    """A one-layer Qwen3 of the tests' shapes with room for T tokens, never stopping at EOS: the engine's
    per-step work, not the model's, is what this file measures."""
    root = tmp_path_factory.mktemp("long_pair")
    dirs = [build_tiny_model(root / side, tiny_tokenizer, "qwen3", seed=i, hidden=32, layers=1,
                             max_positions=T + 256) for i, side in enumerate(("base", "reason"))]
    pair = core.load_pair(str(dirs[0]), str(dirs[1]), device="cpu", dtype="float32")
    return dataclasses.replace(pair, eos_ids=frozenset())


class Clock:
    """progress callback: CPU seconds at each committed token."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, t: int, limit: int) -> None:
        self.times.append(time.process_time())


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~20 s of CPU on a free core; far more on a shared machine
def test_long_response_flat_per_token_cost_and_metrics_match_score(long_pair) -> None:
    CACHES.clear()
    policy = core.Guided(tau=2.5, lam=1.0, window=16)
    clock, rss0 = Clock(), rss_mib()
    trace = core.generate(long_pair, PROMPT, policy, max_new_tokens=T, temperature=0.6, top_p=0.95, progress=clock)
    grown = rss_mib() - rss0
    assert len(trace) == T and len(clock.times) == T
    assert 0 < trace.n_takeovers < T  # the gate fires (about half the time for these random models)
    # CPU per token, last eighth vs the second eighth: attention grows with T, but for these tiny models the
    # fixed per-step work dominates; an O(T) Python step (list copy, re-decode) would be many times slower
    q = T // 8
    early = (clock.times[2 * q] - clock.times[q]) / q
    late = (clock.times[-1] - clock.times[-q - 1]) / q
    assert late < 2.5 * early, f"per-token CPU grew from {early * 1e3:.2f} to {late * 1e3:.2f} ms"
    # memory: KV caches (under 1 KiB per token for both models), held hidden states, and the per-token record;
    # 20 KiB per token is far below any per-step copy of the history (T² / 2 entries)
    assert grown < T * 20 / 1024, f"peak RSS grew {grown:.0f} MiB"
    ref = core.score(long_pair, PROMPT, trace.token_ids.tolist())
    for name, values in trace.metrics.items():
        if name in INT_METRICS:
            mismatch = np.flatnonzero(values != ref.metrics[name])
            assert len(mismatch) <= T // 1000, f"{name} differs at {mismatch[:10]}"  # near-ties only
        else:
            # float32 attention over up to 16k keys, summed in different orders by the cached and the
            # full-sequence kernels: logits differ by more ulps late in the response than at T = 64
            np.testing.assert_allclose(values, ref.metrics[name], atol=1e-4, rtol=1e-5, err_msg=name)
    CACHES.clear()
