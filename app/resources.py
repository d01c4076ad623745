"""Cached resources: the model pair and store once per process, traces and render data per key.

Traces are content-addressed and never change under a key, so caching them by (store, key) is safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import streamlit as st

import core
from app.config import PairSpec
from app.view import SpikeRule, annotate_view, as_problems
from core.spike_rules import Gate, calibrate_gate
from core.metrics import score_values
from core.evaluation.problems import Problem
from core.io.store import TraceStore, default_store_path
from core.trace import Trace

log = logging.getLogger(__name__)


@st.cache_resource(show_spinner=False, max_entries=2)
def load_pair(spec: PairSpec) -> core.ModelPair:
    """Load the pair once per process; core's ModelLoadError / VocabularyMismatchError pass through."""
    if spec.demo:
        import torch

        from core.demo.pair import demo_pair

        # The demo models are tiny: per-step overhead dominates, and a second intra-op thread only adds
        # spin-waiting (on a busy 2-core machine a 60-token greedy run took 64 s with 2 threads, 0.7 s with 1).
        torch.set_num_threads(1)
        device = "cpu" if spec.device == "auto" else spec.device
        dtype = "float32" if spec.dtype == "auto" else spec.dtype
        return demo_pair(device=device, dtype=dtype)
    return core.load_pair(spec.base, spec.reason, device=spec.device, dtype=spec.dtype,
                          base_format=spec.base_format or None, reason_format=spec.reason_format or None)


@st.cache_resource(show_spinner=False)
def get_store(path: str) -> TraceStore:
    """One TraceStore object per directory (it keeps an in-memory index cache)."""
    return TraceStore(path)


def store_path(configured: str | None) -> str:
    """The configured store directory, else $FORKPOINT_STORE, else ./forkpoint-store (absolute)."""
    return str(Path(configured or default_store_path()).expanduser().resolve())


@st.cache_data(show_spinner=False, max_entries=256)
def load_trace(path: str, key: str) -> Trace:
    """The stored trace `key` (StoreError if missing or unreadable)."""
    return get_store(path).get(key)


@st.cache_data(show_spinner=False, max_entries=64)
def view_trace(path: str, key: str, score: str, rule_key: str, _rule: SpikeRule) -> Trace:
    """The stored trace with spikes (under the rule), tags and segments."""
    return annotate_view(load_trace(path, key), score, _rule)


def decoder(pair: core.ModelPair | None, trace: Trace | None = None) -> Callable[[int], str] | None:
    """Token-id -> text through the loaded pair's tokenizer, if the trace was made with that vocabulary."""
    if pair is None:
        return None
    if trace is not None:
        recorded = (trace.meta.get("pair") or {}).get("vocab_size")
        if recorded is not None and int(recorded) != pair.vocab_size:
            return None
    cache: dict[int, str] = {}

    def decode(token_id: int) -> str:
        if token_id not in cache:
            cache[token_id] = pair.token_text(token_id) if 0 <= token_id < pair.vocab_size else f"#{token_id}"
        return cache[token_id]

    return decode


@st.cache_data(show_spinner=False, max_entries=64)
def render_data(path: str, key: str, score: str, scale: str, rule_key: str, pair_label: str,
                _rule: SpikeRule, _pair: Any) -> dict[str, Any]:
    """The token component's payload for a stored trace (see components.token_view.build_view)."""
    from app.components.token_view import build_view

    trace = view_trace(path, key, score, rule_key, _rule)
    return build_view(trace, score=score, scale=scale, decode=decoder(_pair, trace))


@st.cache_data(show_spinner=False, max_entries=8)
def problem_set(path: str | None) -> list[Problem]:
    """The problems the app offers: a problem file, or the demo problems."""
    if path:
        from core.evaluation.problems import load_problems

        return load_problems(path)
    from core.demo.pair import demo_problems

    return as_problems(demo_problems())


@st.cache_data(show_spinner=False, max_entries=16)
def calibrated_gate(path: str, pair_label: str, score: str, ratio: float, window: int, stamp: int) -> Gate:
    """Fit the spike gate on the store's BaseOnly rollouts of this pair (InvalidInputError if none)."""
    store = get_store(path)
    df = store.summaries()
    rows = df[(df["policy"] == "base_only") & (df["kind"] == "generate") & (df["pair"] == pair_label)]
    if rows.empty:
        rows = df[(df["policy"] == "base_only") & (df["kind"] == "generate")]
    if rows.empty:
        raise core.InvalidInputError(
            "The calibrated gate needs base rollouts in the store: run BaseOnly on some problems (Generate page)"
        )
    scores = [score_values(load_trace(path, k).metrics, score) for k in rows["key"].tolist()[:256]]
    return calibrate_gate(scores, ratio, window)
