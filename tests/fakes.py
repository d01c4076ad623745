"""Fake traces for tests: consistent metrics from random float64 logits, no model needed.

`make_trace` is shared by several test files; keep its signature stable (add keywords, never reorder).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from core.scoring.metrics import chunk_metrics
from core.scoring.registry import INT_METRICS, METRICS
from core.trace import SCHEMA_VERSION, Trace, request_key

# A tiny vocabulary; token id i displays as FAKE_VOCAB[i]. Includes markup and newlines on purpose.
FAKE_VOCAB: list[str] = [
    " the", " a", " First", " Wait", " Let", " So", " check", " answer", " is", " 2", " +", " =",
    " 4", ".", ",", "\n", "\n\n", " x", " Alternatively", " To", " find", " we", " need", " step",
    " <b>", "&", ' "q"', " '", " <script>", "</think>", " boxed", "{", "}", " 17", " -", " *",
]

FAKE_TAGS = {"First": "plan", "Let": "plan", "To": "plan", "Wait": "reflect", "Alternatively": "reflect",
             "check": "verify", "answer": "conclude"}  # fmt: skip


def fake_decode(token_id: int) -> str:
    """Display string of a fake token id (ids past the vocabulary show as `<id>`)."""
    return FAKE_VOCAB[token_id] if 0 <= token_id < len(FAKE_VOCAB) else f"<{token_id}>"


def _split_text(text: str) -> list[str]:
    """Split text into word-ish tokens whose join is the text (newlines are their own tokens)."""
    return re.findall(r"\n|[^\S\n]*[^\s]+|[^\S\n]+", text)


def make_trace(
    n_tokens: int = 32,
    seed: int = 0,
    text: str | None = None,
    k: int = 5,
    *,
    vocab_size: int | None = None,
    annotate: bool = False,
    meta: dict[str, Any] | None = None,
    reason_share: float = 0.1,
    sharpness: float = 3.0,
) -> Trace:
    """A random but internally consistent `Trace` (metrics from `chunk_metrics` on float64 logits).

    text      if given, the response is this text split into word-ish tokens (n_tokens is ignored);
              otherwise n_tokens ids are drawn from FAKE_VOCAB.
    annotate  add "spikes" (top 10% cross-entropy), "tags" and "segments" layers.
    meta      entries that override the default reproducibility record (the key is recomputed from
              meta["request"] unless meta gives "key").
    """
    rng = np.random.default_rng(seed)
    if text is not None:
        tokens = _split_text(text)
        lookup = {s: i for i, s in enumerate(FAKE_VOCAB)}
        ids = [lookup.get(s, len(FAKE_VOCAB) + (sum(map(ord, s)) % 97)) for s in tokens]
    else:
        ids = rng.integers(0, len(FAKE_VOCAB), size=n_tokens).tolist()
        tokens = [FAKE_VOCAB[i] for i in ids]
    n = len(ids)
    vocab = max(vocab_size or 0, len(FAKE_VOCAB) + 97, max(ids, default=0) + 1, k)
    gen = torch.Generator().manual_seed(seed)
    logits_base = torch.randn(n, vocab, generator=gen, dtype=torch.float64) * sharpness
    logits_reason = logits_base + torch.randn(n, vocab, generator=gen, dtype=torch.float64) * sharpness
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: thread start-up costs more than the maths here
    try:
        out = chunk_metrics(logits_base, logits_reason, torch.tensor(ids, dtype=torch.int64), k=k)
    finally:
        torch.set_num_threads(threads)
    metrics = {
        name: out[name].numpy().astype(np.int64 if name in INT_METRICS else np.float64) for name in METRICS
    }
    topk = {
        side: (out[f"topk_{side}_ids"].numpy().astype(np.int64), out[f"topk_{side}_probs"].numpy().astype(np.float32))
        for side in ("base", "reason")
    }
    draw = rng.random(n)
    source = np.where(draw < reason_share, "reason", "base").astype(object)
    if n > 3 and reason_share > 0:
        source[n // 3] = "forced"
    request = {"prompt": f"problem {seed}", "response": ids, "pair": "fake-base|fake-reason", "k": k}
    record: dict[str, Any] = {
        "kind": "score",
        "request": request,
        "problem": {"id": f"p{seed}", "prompt": f"What is 2 + 2? (#{seed})", "gold": "4"},
        "pair": {
            "base": {"id": "fake/base-0.1B", "revision": "abc123", "gguf_file": None},
            "reason": {"id": "fake/reason-0.1B", "revision": "def456", "gguf_file": None},
            "dtype": "float64",
            "device": "cpu",
        },
        "formats": {"base": "Question: {problem}\nAnswer:", "reason": "chat:think"},
        "policy": {"name": "guided", "params": {"r": 0.05, "W": 8}},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "seed": seed, "max_new_tokens": 256},
        "parent": None,
        "branch_pos": None,
        "answer": "4",
        "correct": bool(seed % 2 == 0),
        "timings": {"score_s": 0.01},
        "versions": {"forkpoint": "0+test", "torch": torch.__version__},
        "schema": SCHEMA_VERSION,
        "created": f"2026-01-01T00:00:{seed % 60:02d}+00:00",
    }
    record.update(meta or {})
    record.setdefault("key", request_key(record["request"]))
    trace = Trace(
        token_ids=np.asarray(ids, dtype=np.int64),
        tokens=tokens,
        prompt_ids={"base": [1, 2, 3, seed % 7], "reason": [4, 5, 6, 7, seed % 5]},
        metrics=metrics,
        topk=topk,
        source=source,
        meta=record,
    )
    if annotate and n:
        ce = metrics["cross_entropy"]
        n_spikes = max(1, n // 10)
        positions = sorted(np.argsort(-ce, kind="stable")[:n_spikes].tolist())
        tags = [FAKE_TAGS.get(t.strip(), "execute") for t in tokens]  # core.annotate.planning's categories
        cut = (2 * n) // 3
        segments = ["think"] * cut + ["answer"] * (n - cut)
        trace = trace.annotate(
            spikes={"rule": {"score": "cross_entropy", "top_p": 0.1}, "positions": positions},
            tags=tags,
            segments=segments,
        )
    return trace


def with_switch_points(trace: Trace, points: list[int]) -> Trace:
    """`trace` with both models' top token set to the emitted one everywhere but `points` (there: another
    token), so `core.views.presentation.flip_changes` gives `points` and the forced tokens (always switch points),
    where the random top-k lists of `make_trace` disagree almost everywhere."""
    emitted = np.asarray(trace.token_ids)
    other = np.where(np.isin(np.arange(len(emitted)), points), emitted + 1, emitted)
    topk = {}
    for side, (ids, probs) in trace.topk.items():
        ids = np.array(ids, copy=True)
        ids[:, 0] = other
        topk[side] = (ids, probs)
    return Trace(trace.token_ids, list(trace.tokens), trace.prompt_ids, trace.metrics, topk, trace.source,
                 dict(trace.meta), dict(trace.annotations))
