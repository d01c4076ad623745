"""`RayExecutor`: generation jobs on Ray actors, each of which loads the pair once (a GPU per actor when the
cluster has GPUs, CPU otherwise) and takes one batch at a time from the driver.

The driver keeps the store: it reads what is stored, sends only the missing rows, and writes each batch
as it returns (see `core.scale.executors.drive`). A batch whose actor dies is sent again (to the next
free actor; the dead one restarts and reloads the pair), so a killed worker loses no work and doubles
none: a trace's key is its request, and the store writes a key once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Self

import pandas as pd

from core.errors import ExecutorError, InvalidInputError
from core.scale.executors import Progress, _Executor, drive
from core.scale.jobs import GenerateJob, Worker, WorkerStats
from core.scale.spec import as_spec

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3  # sends of one batch before the run fails (a batch that kills every worker is a bug)
PROBE_S = 0.5  # seconds between readiness probes of a restarting actor


def import_ray() -> Any:
    """The `ray` module, or ExecutorError saying how to install it."""
    try:
        import ray
    except ImportError as err:
        raise ExecutorError("Ray is not installed; install the extra: pip install 'forkpoint[ray]'") from err
    return ray


def connect(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Join the Ray cluster at `address` ("auto", "ray://host:port"), or start a local one (None).
    Returns True when this call started Ray (and so should shut it down). Already connected: no-op."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address is None and num_cpus is not None:
        kwargs["num_cpus"] = num_cpus
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise ExecutorError(f"Could not connect to Ray at {address!r}: {err}. Start a cluster with "
                            "`ray start --head` (see docs/SCALE.md), or omit the address for a local Ray.") from err
    return True


class RayExecutor(_Executor):
    """Run jobs on `workers` Ray actors (None: one per `gpus_per_worker` GPUs in the cluster, else one per
    `cpus_per_worker` CPUs). `address`: None starts a local Ray; "auto" or "ray://host:port" joins one.
    `workers_write`: with a store on a filesystem every node sees, workers also write (and `on_trace`,
    which must then be a picklable function, runs there first); the driver still writes what is missing."""

    def __init__(self, address: str | None = None, workers: int | None = None, gpus_per_worker: float = 1,
                 cpus_per_worker: float = 1, threads_per_worker: int | None = None, progress_bar: bool = True,
                 max_restarts: int = 2, workers_write: bool = False) -> None:
        if workers is not None and workers < 1:
            raise InvalidInputError(f"workers must be ≥ 1 (or None for one per GPU/CPU), got {workers}")
        if gpus_per_worker < 0 or cpus_per_worker <= 0:
            raise InvalidInputError(f"gpus_per_worker must be ≥ 0 and cpus_per_worker > 0, got "
                                    f"{gpus_per_worker} and {cpus_per_worker}")
        self.address, self.workers = address, workers
        self.gpus_per_worker, self.cpus_per_worker = gpus_per_worker, cpus_per_worker
        self.threads = threads_per_worker
        self.progress_bar, self.max_restarts = progress_bar, max_restarts
        self.workers_write = workers_write
        self._remote: dict[str, Any] = {}  # store path and on_trace for the workers, per run
        self._started = False
        self._actors: list[Any] = []
        self._spec: Any = None
        self._pids: list[int] = []
        self.stats: list[WorkerStats] = []
        self.wall_s = 0.0

    # -- lifecycle --------------------------------------------------------------------------
    def _resources(self) -> tuple[int, float, float, str]:
        """(workers, gpus, cpus per actor, device) for this cluster."""
        ray = import_ray()
        total = ray.cluster_resources()
        gpus = float(total.get("GPU", 0))
        if gpus >= 1 and self.gpus_per_worker > 0:
            n = self.workers or max(1, int(gpus // self.gpus_per_worker))
            return n, self.gpus_per_worker, self.cpus_per_worker, "cuda"
        n = self.workers or max(1, int(float(total.get("CPU", 1)) // self.cpus_per_worker))
        return n, 0.0, self.cpus_per_worker, "cpu"

    def start(self, pair: Any) -> None:
        """Connect to Ray and start the actors for `pair` (a ModelPair or PairSpec); each loads it once."""
        spec = as_spec(pair)
        if self._actors and spec == self._spec:
            return
        self.close_actors()
        self._started = connect(self.address) or self._started
        ray = import_ray()
        n, gpus, cpus, device = self._resources()
        threads = self.threads or max(1, int(cpus))
        cls = ray.remote(Worker)
        self._actors = [cls.options(num_cpus=cpus, num_gpus=gpus, max_restarts=self.max_restarts,
                                    max_task_retries=0).remote(spec, device, threads) for _ in range(n)]
        self._spec = spec
        try:
            where = ray.get([a.where.remote() for a in self._actors])
        except ray.exceptions.RayError as err:
            self.close_actors()
            raise ExecutorError(f"The Ray workers could not load the pair {spec.base} | {spec.reason}: "
                                f"{_cause(err)}") from err
        self.stats = [WorkerStats(f"w{i} {w['worker']}", w["device"]) for i, w in enumerate(where)]
        self._pids = [int(w["pid"]) for w in where]
        log.info("%d Ray workers on %s", n, ", ".join(s.worker for s in self.stats))

    def pids(self) -> list[int]:
        """Process ids the actors had when they started (without asking them: they may be busy)."""
        return list(self._pids)

    def close_actors(self) -> None:
        ray = import_ray()
        for actor in self._actors:
            ray.kill(actor)
        self._actors = []

    def close(self) -> None:
        """Stop the actors, and Ray itself when this executor started it."""
        if self._actors:
            self.close_actors()
        if self._started:
            import_ray().shutdown()
            self._started = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running ----------------------------------------------------------------------------
    def keys(self, jobs: Sequence[GenerateJob]) -> list[list[str]]:
        """Every job's row keys, the jobs spread over the actors (tokenising only)."""
        ray = import_ray()
        n = len(self._actors)
        parts = [list(range(i, len(jobs), n)) for i in range(n)]
        try:
            answers = ray.get([a.keys.remote([jobs[j] for j in part]) for a, part in zip(self._actors, parts) if part])
        except ray.exceptions.RayTaskError as err:  # e.g. a problem the pair cannot format: the user's error
            raise err.as_instanceof_cause() from None
        out: list[list[str]] = [[] for _ in jobs]
        for part, keys in zip([p for p in parts if p], answers):
            for j, k in zip(part, keys):
                out[j] = k
        return out

    def run(self, pending: Sequence[tuple[GenerateJob, list[str]]], ids: Sequence[int]) -> Iterator[tuple]:
        """Yield (id, traces, info) as batches finish: one batch in flight per actor. A batch whose actor
        died goes back to the front of the queue (up to MAX_ATTEMPTS sends); the actor gets work again
        only once it answers a probe after its restart, and leaves the pool if Ray gives up on it."""
        ray = import_ray()
        queue = deque((i, job, skip, 1) for i, (job, skip) in zip(ids, pending))
        free = deque(range(len(self._actors)))
        alive = set(free)
        flight: dict[Any, tuple[int, tuple | None]] = {}  # ref -> (actor, batch), batch None for a probe
        due: list[tuple[float, int]] = []  # (time, actor): probes to send once the actor had time to restart
        while queue or any(item is not None for _, item in flight.values()):
            if not alive:
                raise ExecutorError("Every Ray worker died and Ray could not restart them; see the Ray logs "
                                    "(out of memory is the usual cause).")
            now = time.monotonic()
            for when, a in [d for d in due if d[0] <= now]:
                due.remove((when, a))
                flight[self._actors[a].where.remote()] = (a, None)
            while queue and free:
                a = free.popleft()
                item = queue.popleft()
                flight[self._actors[a].run.remote(item[1], item[2], **self._remote)] = (a, item)
            if not flight:
                time.sleep(max(0.0, min(d[0] for d in due) - now))
                continue
            timeout = max(0.0, min(d[0] for d in due) - now) if due else None
            ready, _ = ray.wait(list(flight), num_returns=1, timeout=timeout)
            if not ready:
                continue
            a, item = flight.pop(ready[0])
            try:
                answer = ray.get(ready[0])
            except ray.exceptions.RayActorError as err:
                # the process died (killed, out of memory, node lost): the batch goes back to the queue and
                # the actor is probed until it is back; a probe Ray answers "died" means restarts are used up
                self._lost(a, item, queue, err)
                if item is None and not isinstance(err, ray.exceptions.ActorUnavailableError):
                    alive.discard(a)
                else:
                    due.append((time.monotonic() + PROBE_S, a))
                continue
            except ray.exceptions.RayTaskError as err:  # the job itself raised: deterministic, not retried
                raise err.as_instanceof_cause() from None
            if item is None:  # a probe: the actor is back (with a new process)
                self._pids[a] = int(answer["pid"])
                free.append(a)
                continue
            free.appendleft(a)
            traces, info = answer
            self.stats[a].add(info)
            yield item[0], traces, info

    def _lost(self, a: int, item: tuple | None, queue: deque, err: BaseException) -> None:
        """Actor `a` died running `item` (None: a probe): put the batch back at the front of the queue."""
        if item is None:
            return
        if item[3] >= MAX_ATTEMPTS:
            raise ExecutorError(f"A batch of {item[1].units} rows failed {item[3]} times; last: "
                                f"{_cause(err)}") from err
        log.warning("worker %s died (%s); sending its batch again", self.stats[a].worker, _cause(err))
        self.stats[a].retried += 1
        queue.appendleft((item[0], item[1], item[2], item[3] + 1))

    def run_jobs(self, pair: Any, jobs: Sequence[GenerateJob], *, store: Any = None,
                 on_trace: Callable[[Any], None] | None = None, progress: Progress | None = None,
                 should_stop: Callable[[], bool] | None = None) -> list[list[Any]]:
        """Per job, its traces (row order), made on the Ray workers and written by this driver."""
        self.start(pair)
        bar = _bar(sum(j.units for j in jobs)) if self.progress_bar else None

        def report(done: int, total: int) -> None:
            if bar is not None:
                bar.n = done
                bar.refresh()
            if progress is not None:
                progress(done, total)

        t0 = time.perf_counter()
        path = getattr(store, "path", None)
        self._remote = {"store_path": str(path), "on_trace": on_trace} if self.workers_write and path else {}
        try:
            return drive(self, jobs, store, on_trace, report, should_stop)
        finally:
            self.wall_s += time.perf_counter() - t0
            self._remote = {}
            if bar is not None:
                bar.close()

    def summary(self) -> pd.DataFrame:
        """Per worker: jobs, units (rows), tokens, busy seconds, units/s, tokens/s, batches retried."""
        return pd.DataFrame([s.row() for s in self.stats])


def _bar(total: int) -> Any:
    import sys

    from tqdm import tqdm

    return tqdm(total=total, desc="ray", unit="row", file=sys.stderr, leave=False)


def _cause(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[-1] if text else type(err).__name__
