"""Work for executors: a job is one engine batch, and `Worker` is what runs jobs next to a loaded pair, in
this process or inside a Ray actor.

A job kind is any picklable object with `units` (rows), `keys(pair)` (each row's store key, in row order,
without a model forward) and `make(pair, store, on_trace)` (the rows, None for a row whose key `store`
holds; new rows passed through `on_trace` and put in `store`). `GenerateJob` (problems x samples under
one policy) is one; `core.instruments.continuations.ContinueJob` (continuations of one trace from one
position) is another.

Jobs are cut by the caller's `batch_size`, never by the number of workers: a batch decodes the same rows
together wherever it runs, so results do not depend on how many workers there are.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core import settings
from core.decoding import generate
from core.errors import InvalidInputError
from core.io.store import TraceStore


@dataclass(frozen=True)
class GenerateJob:
    """One batch for `core.generate`: problems (problem-major, `samples` rows each) under one policy."""

    problems: tuple[Any, ...]
    policy: Any = None
    max_new_tokens: int = settings.MAX_NEW_TOKENS
    temperature: float = settings.TEMPERATURE
    top_p: float = settings.TOP_P
    seed: int = settings.SEED
    samples: int = settings.SAMPLES
    k: int = settings.K
    stop: str | tuple[str, ...] = ()  # as `core.generate` takes it
    lookahead: int | None = None  # the engine's verify-ahead block; None: its default

    @property
    def units(self) -> int:
        """Work units in the job: problem x sample rows (the policy is fixed per job)."""
        return len(self.problems) * self.samples

    def kwargs(self) -> dict[str, Any]:
        out = {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "top_p": self.top_p,
               "seed": self.seed, "samples": self.samples, "k": self.k, "stop": self.stop}
        if self.lookahead is not None:
            out["lookahead"] = self.lookahead
        return out

    def keys(self, pair: Any) -> list[str]:
        """The store keys of the job's rows, in row order (tokenising the prompts is all it does)."""
        return list(generate(pair, list(self.problems), self.policy, store=_KeyProbe(), **self.kwargs()))

    def make(self, pair: Any, store: Any, on_trace: Any = None) -> list[Any]:
        """The job's rows (None where `store` holds the key), new ones through `on_trace` and into `store`."""
        extra = {"on_trace": on_trace} if on_trace is not None else {}
        return generate(pair, list(self.problems), self.policy, store=store, **extra, **self.kwargs())


def make_jobs(problems: Sequence[Any], policy: Any = None, *, batch_size: int = settings.BATCH_SIZE,
              **options: Any) -> list[GenerateJob]:
    """Cut `problems` into jobs of `batch_size` problems each (the engine's batches, in order)."""
    if batch_size < 1:
        raise InvalidInputError(f"batch_size must be ≥ 1, got {batch_size}")
    problems = list(problems)
    return [GenerateJob(tuple(problems[i:i + batch_size]), policy, **options)
            for i in range(0, len(problems), batch_size)]


class _KeyProbe:
    """A store that claims to hold everything and returns each key: `generate` then lists the request
    keys of a batch without running a model (tokenising the prompts is all it does)."""

    def __contains__(self, key: object) -> bool:
        return True

    def get(self, key: str) -> str:
        return key

    def put(self, trace: Any) -> None:  # pragma: no cover - never reached: everything is "stored"
        raise AssertionError("the key probe never stores")


class _Skip:
    """A store that holds exactly `keys` (contents unknown here: `get` gives None, the driver fills in).
    With `target` (a TraceStore every node sees), new traces are also written there by the worker."""

    def __init__(self, keys: set[str], target: Any = None) -> None:
        self.keys, self.target = keys, target

    def __contains__(self, key: object) -> bool:
        return key in self.keys

    def get(self, key: str) -> None:
        return None

    def put(self, trace: Any) -> None:
        if self.target is not None:
            self.target.put(trace)


@dataclass
class WorkerStats:
    """What one worker did: jobs, rows (units), tokens generated, seconds busy."""

    worker: str
    device: str = "cpu"
    jobs: int = 0
    units: int = 0
    tokens: int = 0
    busy_s: float = 0.0
    retried: int = 0  # batches Ray ran again on a restarted process (the worker was killed mid-batch)
    alive: bool = True  # False once Ray used up its restarts and it left the pool

    def add(self, info: dict[str, Any]) -> None:
        """Count one finished job from `Worker.run`'s info (units, tokens, seconds)."""
        self.jobs += 1
        self.units += info["units"]
        self.tokens += info["tokens"]
        self.busy_s += info["seconds"]

    def row(self) -> dict[str, Any]:
        busy = max(self.busy_s, 1e-9)
        return {"worker": self.worker, "device": self.device, "jobs": self.jobs, "units": self.units,
                "tokens": self.tokens, "busy_s": round(self.busy_s, 3),
                "units_per_s": round(self.units / busy, 3), "tokens_per_s": round(self.tokens / busy, 1),
                "retried": self.retried, "alive": self.alive}


class Worker:
    """Holds one loaded pair and runs jobs on it. Ray wraps this class as an actor; in-process, it is used
    as is. `threads` caps torch's intra-op threads (1 for many small CPU workers on one machine);
    `device_map="auto"` spreads each model of the pair over every GPU this process sees."""

    def __init__(self, spec: Any, device: str = settings.DEVICE, threads: int | None = None, pair: Any = None,
                 device_map: str | None = None) -> None:
        import torch

        if threads:
            torch.set_num_threads(int(threads))
        if pair is None:
            pair = spec.load(device, device_map=device_map) if device_map else spec.load(device)
        self.pair = pair
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def serve(self, tag: Any, method: str, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, str, Any]:
        """(tag, "host:pid", self.<method>(*args, **kwargs)): what a pool of actors answers, so the driver
        knows which call an answer belongs to and which process (a restarted one?) made it."""
        return tag, self.name, getattr(self, method)(*args, **kwargs)

    def where(self) -> dict[str, Any]:
        """Host, process id and device of this worker (for the throughput summary)."""
        return {"worker": self.name, "pid": os.getpid(), "device": str(self.pair.device)}

    def keys(self, jobs: Sequence[Any]) -> list[list[str]]:
        """The store keys of each job's rows, in row order (no model forward)."""
        return [job.keys(self.pair) for job in jobs]

    def run(self, job: Any, skip: Sequence[str] = (), store_path: str | None = None,
            on_trace: Any = None) -> tuple[list[Any], dict[str, Any]]:
        """Make the job's rows except those whose key is in `skip` (None in their place), and
        (rows made, tokens made, seconds) for the throughput summary. With `store_path` (a store on a
        filesystem this worker sees), each new trace is passed through `on_trace` and written here too."""
        target = TraceStore(store_path) if store_path is not None else None
        t0 = time.perf_counter()
        traces = job.make(self.pair, _Skip(set(skip), target), on_trace)
        made = [t for t in traces if t is not None]
        info = {"units": len(made), "tokens": sum(len(t) for t in made), "seconds": time.perf_counter() - t0}
        return traces, info
