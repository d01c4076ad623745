"""Executors run generation jobs: `InProcessExecutor` (this process, the pair already loaded, with the
same per-worker summary as Ray's) and `RayExecutor` (Ray actors, each holding the pair once, on a local
machine or a cluster). Without an executor, `core.decoding.generate_many` runs the batches itself, with progress
inside each batch.

Both go through one driver loop, so they share the store rules: rows already in the store are read, not
made; every finished batch is written at once (a killed driver loses nothing written, and a re-run
resumes); `on_trace` runs on every trace before it is written. Results come back in job order.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pandas as pd

from core import settings
from core.errors import GenerationCancelled, InvalidInputError
from core.scale.jobs import GenerateJob, Worker, WorkerStats, make_jobs
from core.scale.spec import PairSpec
from core.settings import Progress
from core.trace import RowSummary

log = logging.getLogger(__name__)



def _meta_blob(trace: Any) -> str:
    return json.dumps(trace.meta, sort_keys=True, default=str)


KEEP = ("traces", "summaries")  # what a run hands back per row
KEYS_WINDOW = 256  # jobs whose row keys are computed together (at least; see drive)
KEYS_PER_WORKER = 16  # ... and at least this many jobs per worker, so a window keeps every worker busy


class _Driver:
    """Store lookups, writes, `on_trace` and progress around a back-end that runs jobs."""

    def __init__(self, store: Any, on_trace: Callable[[Any], None] | None, progress: Progress | None,
                 total: int, keep: str, recheck: Callable[[dict[str, Any]], bool] | None) -> None:
        self.store, self.on_trace, self.progress = store, on_trace, progress
        self.total, self.done = total, 0
        self.keep, self.recheck = keep, recheck

    def lookup(self, key: str) -> bool:
        """Whether `key` is stored (readable; from the store's index when it has one)."""
        if self.keep == "summaries" and hasattr(self.store, "summary"):
            return self.store.summary(key) is not None
        return key in self.store

    def finish(self, traces: list[Any], keys: list[str] | None) -> list[Any]:
        """Fill rows the worker skipped from the store, run on_trace, write; returns the traces (or their
        summaries)."""
        out = []
        recheck = self.recheck if self.on_trace is not None else None
        for j, trace in enumerate(traces):
            new = trace is not None
            if not new:
                if self.keep == "summaries":
                    found = RowSummary.resumed(self.store, keys[j], recheck)
                    if found is not None:  # a resume: the index says all we keep
                        out.append(found)
                        continue
                trace = self.store.get(keys[j])
            before = None if new else _meta_blob(trace)
            if self.on_trace is not None:
                self.on_trace(trace)
            if self.store is not None:
                if new:
                    self.store.put(trace)
                elif before != _meta_blob(trace):  # a stored trace that on_trace changed (e.g. newly graded)
                    self.store.put(trace, overwrite=True)
            out.append(trace if self.keep == "traces" else RowSummary.of_trace(trace))
        self.done += len(out)
        if self.progress is not None:
            self.progress(self.done, self.total)
        return out


def drive(backend: Any, jobs: Sequence[GenerateJob], store: Any = None,
          on_trace: Callable[[Any], None] | None = None, progress: Progress | None = None,
          should_stop: Callable[[], bool] | None = None, *, keep: str = "traces",
          recheck: Callable[[dict[str, Any]], bool] | None = None,
          on_rows: Callable[[int, list[Any]], None] | None = None) -> list[list[Any]]:
    """Run `jobs` on `backend` (keys(jobs), run(pending) -> iterator of (i, traces, info); optional `parallel`:
    its number of workers); per job, its traces in row order. Rows whose key is in `store` are read from it
    instead of being made; each batch is written as it returns. Jobs go in windows of KEYS_WINDOW (or
    KEYS_PER_WORKER per worker): a window's row keys are computed when it starts and dropped as its jobs end. `should_stop()` is asked between batches; True raises GenerationCancelled
    (finished batches stay stored).

    keep="summaries": per row a `RowSummary` instead of the trace, so the driver holds no token arrays: a
    new trace is dropped once written, and a stored row is summarised from the store's index without
    reading its file, unless `recheck(summary row)` is true (then it is read and passed through on_trace,
    e.g. to grade a row stored ungraded). `on_rows(job index, rows)`: each job's rows are handed over as
    the job finishes (in any order) instead of being collected; the result is then empty."""
    if keep not in KEEP:
        raise InvalidInputError(f"keep must be one of {', '.join(KEEP)}, got {keep!r}")
    jobs = list(jobs)
    driver = _Driver(store, on_trace, progress, sum(j.units for j in jobs), keep, recheck)
    results: list[list[Any] | None] = [None] * len(jobs)

    def deliver(i: int, rows: list[Any]) -> None:
        if on_rows is None:
            results[i] = rows
        else:
            on_rows(i, rows)

    # Keys are asked for one window of jobs at a time, so the driver holds the keys of at most one window
    # (plus the jobs of it still running), not of the whole run. The pool drains at each window's end.
    window = max(KEYS_WINDOW, KEYS_PER_WORKER * int(getattr(backend, "parallel", 1) or 1))
    for first in range(0, len(jobs), window):
        ids = list(range(first, min(first + window, len(jobs))))
        keys = dict(zip(ids, backend.keys([jobs[i] for i in ids]))) if store is not None else {}
        pending: list[tuple[int, list[str]]] = []
        for i in ids:
            job_keys = keys.get(i)
            stored = [k for k in job_keys if driver.lookup(k)] if job_keys is not None else []
            if job_keys is not None and len(stored) == len(job_keys):
                deliver(i, driver.finish([None] * len(job_keys), keys.pop(i)))
            else:
                pending.append((i, stored))
        for i, traces, _info in backend.run([(jobs[i], skip) for i, skip in pending], [i for i, _ in pending]):
            deliver(i, driver.finish(traces, keys.pop(i, None)))  # a finished batch is stored before any stop
            made = sum(t is not None for t in traces)
            log.debug("job %d: %d rows made, %d read from the store", i, made, len(traces) - made)
            if should_stop is not None and should_stop():
                raise GenerationCancelled("generation cancelled; the batches finished so far are stored")
    return [] if on_rows is not None else results  # type: ignore[return-value]


class _Executor:
    """What both executors offer: `run_jobs` (the general form) and `generate_many` (problems in, a flat
    problem-major list of traces out, like `core.decoding.generate_many`)."""

    def run_jobs(self, pair: Any, jobs: Sequence[GenerateJob], *, store: Any = None,
                 on_trace: Callable[[Any], None] | None = None, progress: Progress | None = None,
                 should_stop: Callable[[], bool] | None = None, keep: str = "traces",
                 recheck: Callable[[dict[str, Any]], bool] | None = None,
                 on_rows: Callable[[int, list[Any]], None] | None = None) -> list[list[Any]]:
        raise NotImplementedError

    def generate_many(self, pair: Any, problems: Sequence[Any], policy: Any = None, *,
                      samples: int = settings.SAMPLES, batch_size: int = settings.BATCH_SIZE,
                      max_new_tokens: int = settings.MAX_NEW_TOKENS, temperature: float = settings.TEMPERATURE,
                      top_p: float = settings.TOP_P, seed: int = settings.SEED, stop: Sequence[str] = (),
                      k: int = settings.K, lookahead: int | None = None, store: Any = None,
                      on_trace: Callable[[Any], None] | None = None, progress: Progress | None = None,
                      should_stop: Callable[[], bool] | None = None, keep: str = "traces",
                      recheck: Callable[[dict[str, Any]], bool] | None = None,
                      on_rows: Callable[[int, list[Any]], None] | None = None) -> list[Any]:
        """Problems x samples under `policy`, in batches of `batch_size` problems; traces (or `RowSummary`
        records, keep="summaries": see `drive`) problem-major; with `on_rows`, handed over per batch."""
        jobs = make_jobs(problems, policy, batch_size=batch_size, samples=samples, max_new_tokens=max_new_tokens,
                         temperature=temperature, top_p=top_p, seed=seed, stop=stop, k=k, lookahead=lookahead)
        out = self.run_jobs(pair, jobs, store=store, on_trace=on_trace, progress=progress, should_stop=should_stop,
                            keep=keep, recheck=recheck, on_rows=on_rows)
        return [t for traces in out for t in traces]


class _LocalBackend:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.stats = WorkerStats(worker.name, str(worker.pair.device))

    def keys(self, jobs: Sequence[GenerateJob]) -> list[list[str]]:
        return self.worker.keys(jobs)

    def run(self, pending: Sequence[tuple[GenerateJob, list[str]]], ids: Sequence[int]) -> Iterator[tuple]:
        for i, (job, skip) in zip(ids, pending):
            traces, info = self.worker.run(job, skip)
            self.stats.add(info)
            yield i, traces, info


class InProcessExecutor(_Executor):
    """Runs every job here, on the given pair (a loaded ModelPair, or a PairSpec loaded once on first use)."""

    def __init__(self, device: str = settings.DEVICE) -> None:
        self.device = device
        self._loaded: dict[Any, Any] = {}
        self.stats: list[WorkerStats] = []

    def _pair(self, pair: Any) -> Any:

        if not isinstance(pair, PairSpec):
            return pair
        if pair not in self._loaded:
            self._loaded[pair] = pair.load(self.device)
        return self._loaded[pair]

    def run_jobs(self, pair: Any, jobs: Sequence[GenerateJob], *, store: Any = None,
                 on_trace: Callable[[Any], None] | None = None, progress: Progress | None = None,
                 should_stop: Callable[[], bool] | None = None, keep: str = "traces",
                 recheck: Callable[[dict[str, Any]], bool] | None = None,
                 on_rows: Callable[[int, list[Any]], None] | None = None) -> list[list[Any]]:
        """Per job, its traces (row order; summaries with keep="summaries"), made in this process."""
        backend = _LocalBackend(Worker(None, pair=self._pair(pair)))
        out = drive(backend, jobs, store, on_trace, progress, should_stop, keep=keep, recheck=recheck,
                    on_rows=on_rows)
        self.stats = [backend.stats]
        return out

    def summary(self) -> pd.DataFrame:
        """Per worker (here: one): jobs, units, tokens, busy seconds, units/s and tokens/s."""
        return pd.DataFrame([s.row() for s in self.stats])
