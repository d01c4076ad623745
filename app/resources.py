"""Cached resources: the model pair and store once per process, traces and render data per key.

Traces are content-addressed and never change under a key, so caching them by (store, key) is safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

import streamlit as st

import core
from app.config import PairChoice
from app.view import SpikeRule, annotate_view, as_problems
from core import settings
from core.annotate.spikes import Gate
from core.evaluation.problems import Problem
from core.instruments.effects import attach_effects, effects_stamp
from core.io.notes import attach_notes
from core.io.store import TraceStore, default_store_path
from core.io.stored_traces import StoredTraces
from core.trace import Trace
from core.views.token_payload import view_payload as token_payload

log = logging.getLogger(__name__)


@st.cache_resource(show_spinner=False, max_entries=2)
def load_pair(spec: PairChoice) -> core.ModelPair:
    """Load the pair once per process; core's ModelLoadError / VocabularyMismatchError pass through."""
    if spec.demo:
        import torch

        from core.demo.pair import demo_pair

        # The demo models are tiny: per-step overhead dominates, and a second intra-op thread only adds
        # spin-waiting (on a busy 2-core machine a 60-token greedy run took 64 s with 2 threads, 0.7 s with 1).
        torch.set_num_threads(1)
        device = "cpu" if spec.device == "auto" else spec.device
        dtype = "float32" if spec.dtype == "auto" else spec.dtype
        return demo_pair(device=device, dtype=dtype, base_format=spec.base_format or None,
                         reason_format=spec.reason_format or None)  # `forkpoint app --base-format` applies to it too
    return core.load_pair(**spec.load_arguments())


@st.cache_resource(show_spinner=False)
def warm_up() -> threading.Thread:
    """Once per process, in the background, what grading a switch's child needs first: the planning tagger
    (spaCy) and the math-verify worker (a child process, started on a thread's first check). Without it the
    first switch on a freshly opened trace paid both (seconds, and 0.6 s for the worker) and later ones not."""

    def load() -> None:
        from core.annotate.planning import tag_tokens  # spaCy: a heavy optional dependency
        from core.evaluation.grading import check_answer  # math-verify (sympy): heavy, loaded off the first run

        for name, job in (("tagger", lambda: tag_tokens(["Let", " me", " check", "."])),
                          ("grader", lambda: check_answer("2", "2"))):
            try:
                job()
            except Exception as err:  # noqa: BLE001 - a warm-up only: the switch itself reports a real failure
                log.info("%s warm-up failed: %s", name, err)

    thread = threading.Thread(target=load, name="forkpoint-warm-up", daemon=True)
    thread.start()
    return thread


@st.cache_resource(show_spinner=False)
def get_store(path: str) -> TraceStore:
    """One TraceStore object per directory (it keeps an in-memory index cache)."""
    return TraceStore(path)


DEEP_CHECK_WAIT_S = 1.0  # a page waits this long for the store's full read, then draws and shows the rest later


class DeepCheck:
    """A full read of every trace file of one store (`TraceStore.unreadable()`), run in a thread of its own: a store
    of thousands of traces takes seconds (5,600 demo traces: 5.5 s) the first time a server reads them, and the page
    that shows damaged files need not wait for it. Files already read in full are not read again (the store keeps
    each file version's verdict)."""

    FRESH_S = 30.0  # a read that finished this recently, and whose outcome nobody has had, is handed out as it is

    def __init__(self, store: TraceStore) -> None:
        self.store, self._lock = store, threading.Lock()
        self._future: Future | None = None
        self._handed: Future | None = None  # the read whose outcome was last handed out
        self._finished = 0.0  # time.monotonic() when the last read finished

    def result(self, wait_s: float) -> list[tuple[Path, str]] | None:
        """The damaged files found by a full read: the one under way, one that has just finished and whose
        outcome nobody has had yet (the page rerun when it finished), else one that starts now; None when it has
        not finished within `wait_s` seconds. Its errors (an unreadable folder) are raised here, once."""
        with self._lock:
            future = self._future
            unseen = (future is not None and future.done() and future is not self._handed
                      and time.monotonic() - self._finished < self.FRESH_S)
            if future is None or (future.done() and not unseen):
                future = self._future = Future()
                # a daemon thread: a server told to stop does not wait for the read (a pool's worker is joined)
                threading.Thread(target=self._read, args=(future,), name="forkpoint-deep-check", daemon=True).start()
        try:
            out = future.result(timeout=wait_s)
        except FutureTimeout:
            return None
        finally:
            if future.done():
                self._handed = future
        return out

    def _read(self, future: Future) -> None:
        try:
            found = self.store.unreadable()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on `result`
            self._finished = time.monotonic()
            future.set_exception(exc)
        else:
            self._finished = time.monotonic()
            future.set_result(found)

    def running(self) -> bool:
        """Whether a full read is under way."""
        with self._lock:
            return self._future is not None and not self._future.done()


@st.cache_resource(show_spinner=False)
def deep_check(path: str) -> DeepCheck:
    """The store's one background full read (see `DeepCheck`)."""
    return DeepCheck(get_store(path))


def store_path(configured: str | None) -> str:
    """The configured store directory, else $FORKPOINT_STORE, else ./forkpoint-store (absolute)."""
    return str(Path(configured or default_store_path()).expanduser().resolve())


@st.cache_data(show_spinner=False, max_entries=256)
def load_trace(path: str, key: str) -> Trace:
    """The stored trace `key` (StoreError if missing or unreadable)."""
    return get_store(path).get(key)


@st.cache_resource(show_spinner=False, max_entries=1, ttl=600)
def stored_traces(path: str, keys: tuple[str, ...]) -> StoredTraces:
    """The stored traces `keys` of the Dataset page's selection: read as used, the first `report_keep_gib` of them
    kept, for every table and tab of that selection (each scans them all) for up to 10 minutes; none go through
    `load_trace`'s cache (thousands would evict the open traces)."""
    return StoredTraces(get_store(path), keys).keeping(settings.gib_bytes(settings.REPORT_KEEP_GIB))


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
                _rule: SpikeRule, _pair: Any, vmin: float | None = None, vmax: float | None = None,
                range_tag: str = "trace", _reference: Any = None, start: int = 0,
                end: int | None = None, notes_tag: str = "", effects_tag: str = "") -> dict[str, Any]:
    """The token component's payload for a stored trace (see core.views.token_payload.view_payload), coloured
    on [vmin, vmax] (`range_tag` names that range for the cache; `_reference` pools rank-scale values), with
    its notes marked (`notes_tag`: core.io.notes.notes_stamp, so a new note makes a new payload) and its
    measured takeover effects (`effects_tag`: core.instruments.effects.effects_stamp; "" when none)."""
    return view_payload(path, view_trace(path, key, score, rule_key, _rule), score, scale, _pair, vmin, vmax,
                        _reference, start, end, effects=bool(effects_tag))


def view_payload(path: str, trace: Trace, score: str, scale: str, pair: Any, vmin: float | None,
                 vmax: float | None, reference: Any = None, start: int = 0, end: int | None = None,
                 effects: bool = True) -> dict[str, Any]:
    """`render_data` uncached, for an annotated trace: its notes and (with `effects`) measured effects
    marked, then core.views.token_payload.view_payload."""
    return token_payload(marked(path, trace, score, effects), score=score, scale=scale, decode=decoder(pair, trace),
                         vmin=vmin, vmax=vmax, reference=reference, start=start, end=end)


def marked(path: str, trace: Trace, score: str, effects: bool | None = True) -> Trace:
    """The trace with its stored notes and (with `effects`; None: when any are stored) its measured takeover
    effects as annotation layers: the store's part of a view, read before anything is drawn."""
    trace = attach_notes(path, trace)
    store = get_store(path)
    if effects is None:
        effects = bool(effects_stamp(store, trace.key))
    return attach_effects(store, trace, score=score) if effects else trace


@st.cache_data(show_spinner=False, max_entries=16)
def _vocab(_pair: Any, fingerprint: str) -> tuple[str, ...]:
    """Every token's display text, by id (once per pair)."""
    return tuple(_pair.token_text(i) for i in range(_pair.vocab_size))


def vocab_search(pair: core.ModelPair, query: str, limit: int) -> list[tuple[int, str]]:
    """Up to `limit` (id, text) vocabulary entries containing `query` (exact text first, then shortest)."""
    vocab = _vocab(pair, repr(pair.fingerprint()))
    needle = query.lower()
    hits = [(i, t) for i, t in enumerate(vocab) if needle in t.lower()]
    hits.sort(key=lambda it: (it[1].strip().lower() != needle, len(it[1]), it[0]))
    return hits[:limit]


def problem_set(path: str | None) -> list[Problem]:
    """The problems the app offers: a problem file (read again when it changes), or the demo problems."""
    try:
        stamp = Path(path).stat().st_mtime_ns if path else 0
    except OSError:
        stamp = -1  # missing: load_problems says so
    return _problem_set(path, stamp)


@st.cache_data(show_spinner=False, max_entries=8)
def _problem_set(path: str | None, stamp: int) -> list[Problem]:
    if path:
        from core.evaluation.problems import load_problems

        return load_problems(path)
    from core.demo.pair import demo_problems

    return as_problems(demo_problems())


@st.cache_data(show_spinner=False, max_entries=16)
def calibrated_gate(path: str, fingerprint: str, score: str, ratio: float, window: int, stamp: int,
                    _pair: Any) -> Gate:
    """Fit the spike gate through core on the store's BaseOnly rollouts of THIS pair (keyed by its
    fingerprint); InvalidInputError when the store has none of this pair (never another pair's)."""
    from core.decoding import calibrate

    return calibrate(_pair, None, ratio=ratio, window=window, score=score, store=get_store(path))


def has_rollouts(pair: core.ModelPair, path: str) -> bool:
    """Whether the store holds BaseOnly rollouts of this pair (to calibrate the gate on)."""
    from core.decoding import has_base_rollouts

    return bool(has_base_rollouts(pair, get_store(path)))


def max_new_tokens(pair: core.ModelPair | None) -> int:
    """The app's response length: --max-new-tokens when given, else the pair's default (`ModelPair.
    default_max_new_tokens`: settings.MAX_NEW_TOKENS, at most half its context; the demo pair's 192 tokens: 96),
    so the default never asks for more than fits beside the prompt."""
    given = st.session_state["config"].max_new_tokens
    if given is not None:
        return int(given)
    return pair.default_max_new_tokens() if pair is not None else settings.MAX_NEW_TOKENS
