"""Generating traces: `generate` (one batch of problems x samples) and `generate_many` (the one path that
runs many problems in batches, with progress, a store and a per-trace hook, used by the CLI, the app and
the evaluation harness).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from core import settings
from core.decoding.caches import hold
from core.decoding.engine import Decoder, Row, check_lookahead
from core.decoding.policies import BaseOnly, Policy, row_identity
from core.decoding.sampling import Sampling, row_seed
from core.errors import InvalidInputError
from core.pair.loading import ModelPair
from core.record.assembly import assemble
from core.record.meta import make_meta
from core.record.problems import problem_record
from core.record.request import request
from core.settings import Progress
from core.trace import RowSummary, Trace


def make_rows(pair: ModelPair, problems: list[Any], samples: int, policy: Policy, sampling: Sampling, k: int,
              kind: str = "generate", extra_request: dict[str, Any] | None = None, first_sample: int = 0) -> list[Row]:
    """One `Row` per (problem, sample), problem-major, each with its request key and meta."""
    settings.SETTINGS["k"].check(k, "k")
    rows = []
    for problem in problems:
        rec = problem_record(problem)
        prompt_ids = pair.prompt_ids(rec["prompt"])
        # refuse a prompt that cannot fit, before any forward; stop a response where the context ends
        room = pair.check_context(prompt_ids, sampling.max_new_tokens)
        for s in range(first_sample, first_sample + samples):
            asked = request(kind, pair.fingerprint(), prompt=rec["prompt"], policy=policy.record(),
                            sampling=sampling.record(s), k=k, **(extra_request or {}))
            meta = make_meta(pair, kind=kind, request=asked, problem=rec, policy=policy.record(),
                             sampling=sampling.record(s))
            if policy.fit:
                meta["calibration"] = dict(policy.fit)
            if room < sampling.max_new_tokens:
                meta["context_limit"] = {"max_response_tokens": room}
            rows.append(Row(rec, prompt_ids, meta, row_seed(sampling, s),
                            room=room if room < sampling.max_new_tokens else None,
                            identity=row_identity(rec["prompt"], s)))
    return rows


def generate(pair: ModelPair, prompt: Any | Sequence[Any], policy: Policy | None = None, *,
             max_new_tokens: int = settings.MAX_NEW_TOKENS, temperature: float = settings.TEMPERATURE,
             top_p: float = settings.TOP_P, seed: int = settings.SEED, stop: Sequence[str] = (),
             samples: int = settings.SAMPLES, k: int = settings.K, lookahead: int | None = None, store: Any = None,
             progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
             on_trace: Callable[[Trace], Any] | None = None) -> Trace | list[Trace]:
    """Generate with the base model, letting `policy` hand single tokens to the reasoner.

    `prompt` is one problem (text, dict or Problem) -> one Trace, or a list -> a list of Traces
    (problem-major, `samples` rows each, all decoded in one batch). `lookahead`: None = verify-ahead
    with an adaptive block, 1 = lock-step, n = blocks of at most n (the tokens are the same). With
    `store`, stored rows are returned without recomputation; `on_trace` (see `generate_many`) runs on
    every trace before it is stored.
    """
    policy = policy or BaseOnly()
    check_lookahead(lookahead)
    sampling = Sampling(temperature, top_p, seed, max_new_tokens, stop)
    single = isinstance(prompt, (str, dict)) or hasattr(prompt, "prompt")
    problems = [prompt] if single else list(prompt)
    if samples < 1:
        raise InvalidInputError(f"samples must be ≥ 1, got {samples}")
    rows = make_rows(pair, problems, samples, policy, sampling, k)
    traces: list[Trace | None] = [None] * len(rows)
    todo = []
    for i, r in enumerate(rows):
        if store is not None and r.meta["key"] in store:
            traces[i] = _stored(store, r.meta["key"], on_trace)
        else:
            todo.append(i)
    if todo:
        t0 = time.perf_counter()
        batch = [rows[i] for i in todo]
        decoder = Decoder(pair, batch, policy, sampling, k, lookahead=lookahead, progress=progress,
                          should_stop=should_stop)
        arrays = decoder.run()
        elapsed = time.perf_counter() - t0
        for j, (i, r) in enumerate(zip(todo, batch)):
            r.meta["timings"] = {"generate_s": round(elapsed, 4), "batch": len(batch)}
            trace = assemble(pair, r.tokens, r.prompt_ids, arrays[j], r.source, r.meta)
            if len(batch) == 1:
                hold(trace, decoder.states)
            if on_trace is not None:
                on_trace(trace)
            if store is not None:
                store.put(trace)
            traces[i] = trace
    return traces[0] if single and samples == 1 else traces  # type: ignore[return-value]


def _stored(store: Any, key: str, on_trace: Callable[[Trace], Any] | None) -> Trace | None:
    """A stored trace, passed through `on_trace`; re-written only when the hook changed its meta. None
    when the store stands in for rows kept elsewhere (`_Resumed`, a worker's skip list)."""
    trace = store.get(key)
    if trace is not None and on_trace is not None:
        before = dict(trace.meta)
        on_trace(trace)
        if trace.meta != before:
            store.put(trace, overwrite=True)
    return trace


class _Resumed:
    """`store`, except that `resumed` keys count as stored and read as None: their summaries came from the
    store's index, so `generate` neither makes nor reads them."""

    def __init__(self, store: Any, resumed: set[str]) -> None:
        self.store, self.resumed = store, resumed

    def __contains__(self, key: object) -> bool:
        return key in self.resumed or key in self.store

    def get(self, key: str) -> Trace | None:
        return None if key in self.resumed else self.store.get(key)

    def put(self, trace: Trace, overwrite: bool = False) -> Any:
        return self.store.put(trace, overwrite=overwrite)


def generate_many(pair: ModelPair, problems: Sequence[Any], policy: Policy | None = None, *,
                  samples: int = settings.SAMPLES, batch_size: int = settings.BATCH_SIZE,
                  max_new_tokens: int = settings.MAX_NEW_TOKENS, temperature: float = settings.TEMPERATURE,
                  top_p: float = settings.TOP_P, seed: int = settings.SEED, stop: Sequence[str] = (),
                  k: int = settings.K, lookahead: int | None = None, store: Any = None,
                  on_trace: Callable[[Trace], Any] | None = None, progress: Progress | None = None,
                  should_stop: Callable[[], bool] | None = None, executor: Any = None, keep: str = "traces",
                  recheck: Callable[[dict[str, Any]], bool] | None = None,
                  on_rows: Callable[[int, list[Any]], None] | None = None) -> list[Any]:
    """Run `policy` on `problems` x `samples` in batches of `batch_size` problems; problem-major traces.

    `on_trace(trace)` runs on every trace (fresh or from the store) before it is written (e.g. grading);
    a stored trace whose meta it changed is re-written. `progress(rows done, rows total)` is called
    during each batch too. Without a store nothing is written. `executor` (e.g. `core.RayExecutor()`)
    runs the same batches elsewhere, with the same results (docs/SCALE.md); None: in this process.
    keep="summaries": a `RowSummary` per row instead of the trace (memory bounded by one batch); stored rows
    come from the store's index (`RowSummary.resumed`, as the executors' driver does), and are read in full
    only where `recheck(row)` says (with an `on_trace` to run on them). `on_rows(batch number, rows)`: each
    batch's rows are handed over as it finishes instead of being collected (the result is then empty).
    """
    if keep not in ("traces", "summaries"):
        raise InvalidInputError(f"keep must be 'traces' or 'summaries', got {keep!r}")
    if executor is not None:
        return executor.generate_many(pair, problems, policy, samples=samples, batch_size=batch_size,
                                      max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                                      stop=stop, k=k, lookahead=lookahead, store=store, on_trace=on_trace,
                                      progress=progress, should_stop=should_stop, keep=keep, recheck=recheck,
                                      on_rows=on_rows)
    problems = list(problems)
    if batch_size < 1:
        raise InvalidInputError(f"batch_size must be ≥ 1, got {batch_size}")
    total, done = len(problems) * samples, 0
    out: list[Any] = []
    sampling = Sampling(temperature, top_p, seed, max_new_tokens, stop)
    for batch, start in enumerate(range(0, len(problems), batch_size)):
        chunk = problems[start:start + batch_size]
        before, rows = done, len(chunk) * samples

        def step(t: int, limit: int, _before: int = before, _rows: int = rows) -> None:
            if progress is not None:
                progress(_before + int(_rows * t / max(limit, 1)), total)

        resumed: dict[int, RowSummary] = {}
        if keep == "summaries" and store is not None:
            keys = [r.meta["key"] for r in make_rows(pair, chunk, samples, policy or BaseOnly(), sampling, k)]
            for j, key in enumerate(keys):
                found = RowSummary.resumed(store, key, recheck if on_trace is not None else None)
                if found is not None:
                    resumed[j] = found
        traces: Any = [None] * rows
        if len(resumed) < rows:
            view = _Resumed(store, {keys[j] for j in resumed}) if resumed else store
            traces = generate(pair, chunk, policy, max_new_tokens=max_new_tokens, temperature=temperature,
                              top_p=top_p, seed=seed, stop=stop, samples=samples, k=k, lookahead=lookahead,
                              store=view, progress=step, should_stop=should_stop, on_trace=on_trace)
            traces = [traces] if isinstance(traces, Trace) else traces
        got = [resumed[j] if j in resumed else t if keep == "traces" else RowSummary.of_trace(t)
               for j, t in enumerate(traces)]
        done += len(got)
        if on_rows is not None:
            on_rows(batch, got)
        else:
            out += got
        if progress is not None:
            progress(done, total)
    return out
