"""Every metric on every path at a full-size vocabulary (151,936 tokens, Qwen3's) against float64.

A word-level tokenizer of that size is built in-process; the models are tiny (hidden 32, one layer),
so the cost is the vocabulary. Each trace (score, score_batch, generate lock-step and verify-ahead,
batched sampled generate, branch with and without held caches, the lazy EntropyGated catch-up) is
re-run teacher-forced as a full float64 forward of each model (tests/refmetrics.py) and every metric
must be within 1e-5. At this size torch.log_softmax alone is off by ~2e-5, so a second log-softmax
implementation anywhere fails here.
"""

from __future__ import annotations

import numpy as np
import pytest
from refmetrics import model_reference, reference_errors

import core
from core.demo.tiny import build_tiny_model, word_tokenizer
from core.scoring.registry import METRICS

VOCAB = 151_936
TOL = 1e-5
PROMPTS = ["Tom has 3 boxes of 4 apples. How many apples?", "What is 12 - 2 ? Explain each step."]
RESPONSE = "First, we multiply, then we subtract. 3 * 4 = 12. 12 - 2 = 10. The answer is 10. w17 w151000 w9"
N_NEW = 8  # new tokens per generated trace: the reference costs ~50 ms per position at this vocabulary


def build_big_pair(root, device: str = "cpu", dtype: str = "float32") -> core.ModelPair:
    """A Qwen3 pair (hidden 32, one layer) over a 151,936-token word-level vocabulary, base raw, reasoner chat."""
    tok = word_tokenizer(VOCAB)
    assert len(tok) == VOCAB
    dirs = [build_tiny_model(root / side, tok, "qwen3", seed=10 + i, hidden=32, layers=1, heads=2, kv_heads=1)
            for i, side in enumerate(("base", "reason"))]
    pair = core.load_pair(str(dirs[0]), str(dirs[1]), device=device, dtype=dtype)
    assert pair.vocab_size == VOCAB and pair.formats["reason"].spec == "chat"
    pair.eos_ids = frozenset()  # random weights: never stop early, every trace has its full length
    return pair


@pytest.fixture(scope="module")
def big_pair(tmp_path_factory) -> core.ModelPair:
    return build_big_pair(tmp_path_factory.mktemp("big_vocab"))


def check(pair: core.ModelPair, float64_models, trace: core.Trace, label: str) -> None:
    """Every metric of `trace` within TOL of the float64 forward over its own prompt + tokens."""
    assert len(trace) > 0, label
    ref = model_reference(pair, float64_models, trace.prompt_ids, trace.token_ids.tolist(), k=trace.k or 10)
    assert set(METRICS) <= set(ref)
    bad = reference_errors(trace, ref, atol=TOL)
    assert not bad, f"{label}: " + "; ".join(bad)


def guided_for(pair: core.ModelPair) -> core.Guided:
    """A gate that fires on some positions of these random models (tau = the median base-rollout score)."""
    probe = core.generate(pair, PROMPTS[0], core.BaseOnly(), max_new_tokens=N_NEW)
    tau = float(np.median(probe.metrics["cross_entropy"]))
    return core.Guided(tau=tau, lam=1.0, window=2)


def entropy_gated_for(pair: core.ModelPair) -> core.EntropyGated:
    probe = core.generate(pair, PROMPTS[0], core.BaseOnly(), max_new_tokens=N_NEW)
    return core.EntropyGated(threshold=float(np.median(probe.metrics["entropy_base"])))


def test_score_and_score_batch(big_pair, float64_models) -> None:
    trace = core.score(big_pair, PROMPTS[0], RESPONSE)
    assert len(trace) == len(RESPONSE.split()) and trace.text == RESPONSE
    check(big_pair, float64_models, trace, "score")
    items = [(PROMPTS[1], "12 - 2 = 10."), (PROMPTS[0], "First, we multiply. w151935"), (PROMPTS[1], "Hmm w5")]
    for i, got in enumerate(core.score_batch(big_pair, items, batch_size=3)):
        check(big_pair, float64_models, got, f"score_batch row {i}")


@pytest.mark.parametrize("lookahead", [1, None], ids=["lock-step", "verify-ahead"])
@pytest.mark.parametrize("name", ["guided", "forced", "entropy_gated"])
def test_generate(big_pair, float64_models, name: str, lookahead: int | None) -> None:
    policy = {"guided": lambda: guided_for(big_pair), "forced": lambda: core.Forced({1: 7, 3: "reason"}),
              "entropy_gated": lambda: entropy_gated_for(big_pair)}[name]()
    trace = core.generate(big_pair, PROMPTS[0], policy, max_new_tokens=N_NEW, lookahead=lookahead)
    assert len(trace) == N_NEW
    if name != "entropy_gated":  # the lazy policy may or may not fire; its skipped steps are what it tests
        assert (trace.source != "base").any(), "no takeover: the test would not cover the reasoner's tokens"
    check(big_pair, float64_models, trace, f"generate {name} lookahead={lookahead}")


def test_batched_sampled_generate(big_pair, float64_models) -> None:
    traces = core.generate(big_pair, PROMPTS, guided_for(big_pair), max_new_tokens=N_NEW, temperature=0.8,
                           seed=3, samples=2)
    assert len(traces) == 4
    for i, trace in enumerate(traces):
        check(big_pair, float64_models, trace, f"batched generate row {i}")


def test_branch_held_cold_and_lazy(big_pair, float64_models) -> None:
    from core.decoding.caches import CACHES

    parent = core.generate(big_pair, PROMPTS[1], core.BaseOnly(), max_new_tokens=N_NEW)
    held = core.branch(big_pair, parent, 3, max_new_tokens=N_NEW)
    assert held.meta["branch_pos"] == 3 and held.source[3] == "reason"
    check(big_pair, float64_models, held, "branch (held caches)")
    CACHES.clear()
    cold = core.branch(big_pair, parent, 5, max_new_tokens=N_NEW, policy=entropy_gated_for(big_pair))
    check(big_pair, float64_models, cold, "branch (cold, EntropyGated continuation)")
    assert cold.tokens[:5] == parent.tokens[:5]
