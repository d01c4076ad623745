"""`RayExecutor`: generation jobs on a pool of Ray actors, each of which loads the pair once (on its GPU,
spread over its GPUs when it has several, or on CPU when the cluster has none).

Ray does the fault tolerance. Every actor is made with `max_restarts` and `max_task_retries=-1`: a worker
killed at any moment (mid-batch, or idle between stages) is restarted by Ray, which reloads the pair and
runs again the call it had, so the driver only sees a late answer. Ray's `ActorPool` spreads the calls,
one in flight per actor (back-pressure: nothing waits in a worker's queue). An actor whose restarts are
used up answers `ActorDiedError`: it leaves the pool with a warning, its call goes to another actor, and
the run fails, with a message, only when no actor is left.

The driver keeps the store (see `core.scale.executors.drive`): it reads what is stored, sends only the
missing rows, and writes each batch as it returns. A trace's key is its request, and the store writes a
key once, so a batch run twice (killed after its answer left the worker) is never stored twice.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Self

import pandas as pd

from core.errors import ExecutorError, InvalidInputError
from core.scale.executors import _Executor, drive
from core.scale.jobs import GenerateJob, Worker, WorkerStats
from core.scale.spec import as_spec
from core.settings import Progress

log = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # default wait for the workers to get resources and load the pair
PIDS_WAIT_S = 2.0  # how long pids() waits for busy workers to say who they are
RELEASE_WAIT_S = 10.0  # how long close_actors() waits for Ray to report the actors' resources free again


def import_ray() -> Any:
    """The `ray` module, or ExecutorError saying how to install it."""
    try:
        import ray
    except ImportError as err:
        raise ExecutorError("Ray is not installed; install the extra: pip install 'forkpoint[ray]'") from err
    return ray


def _is_auth_error(ray: Any, err: BaseException) -> bool:
    """Whether `err` is Ray refusing this driver's token (its own type, or a wrapped gRPC 'unauthenticated')."""
    kind = getattr(ray.exceptions, "AuthenticationError", None)
    if kind is not None and isinstance(err, kind):
        return True
    text = (getattr(err, "message", None) or str(err)).lower()
    return any(word in text for word in ("unauthenticated", "auth token", "authentication token", "token auth"))


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
    except Exception as err:  # noqa: BLE001  Ray raises many types here; the ones we cannot explain go on up
        if _is_auth_error(ray, err):
            raise ExecutorError(
                f"The Ray cluster at {address!r} refused this driver: it uses token authentication and this "
                f"process has no valid token ({_cause(err)}). Give it the cluster's token: set RAY_AUTH_MODE=token "
                "and RAY_AUTH_TOKEN=<token> (or RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token) as on the cluster's "
                "nodes; see docs/SCALE.md.") from err
        if isinstance(err, (ConnectionError, RuntimeError, ValueError)):
            raise ExecutorError(f"Could not connect to Ray at {address!r}: {_cause(err)}. Start a cluster with "
                                "`ray start --head` (see docs/SCALE.md), or omit the address for a local Ray.") from err
        raise
    return True


class RayExecutor(_Executor):
    """Run jobs on `workers` Ray actors (None: as many as the cluster's *free* resources hold, one per
    `gpus_per_worker` GPUs, else one per `cpus_per_worker` CPUs). `address`: None starts a local Ray;
    "auto" or "ray://host:port" joins one. `gpus_per_worker` > 1 spreads the pair over the worker's GPUs
    (device_map). `max_restarts`: restarts Ray gives each killed actor before it leaves the pool.
    `start_timeout`: seconds to wait for the workers to get their resources and load the pair.
    `workers_write`: with a store on a filesystem every node sees, workers also write (and `on_trace`,
    which must then be a picklable function, runs there first); the driver still writes what is missing."""

    def __init__(self, address: str | None = None, workers: int | None = None, gpus_per_worker: float = 1,
                 cpus_per_worker: float = 1, threads_per_worker: int | None = None,
                 max_restarts: int = 2, workers_write: bool = False, start_timeout: float = START_TIMEOUT_S) -> None:
        if workers is not None and workers < 1:
            raise InvalidInputError(f"workers must be ≥ 1 (or None for one per GPU/CPU), got {workers}")
        if gpus_per_worker < 0 or cpus_per_worker <= 0:
            raise InvalidInputError(f"gpus_per_worker must be ≥ 0 and cpus_per_worker > 0, got "
                                    f"{gpus_per_worker} and {cpus_per_worker}")
        if gpus_per_worker > 1 and gpus_per_worker != int(gpus_per_worker):
            raise InvalidInputError(f"gpus_per_worker above 1 must be a whole number of GPUs, got {gpus_per_worker}")
        if max_restarts < 0 or not start_timeout > 0:
            raise InvalidInputError(f"max_restarts must be ≥ 0 and start_timeout > 0, got {max_restarts} and "
                                    f"{start_timeout}")
        self.address, self.workers = address, workers
        self.gpus_per_worker, self.cpus_per_worker = gpus_per_worker, cpus_per_worker
        self.threads = threads_per_worker
        self.max_restarts = max_restarts
        self.workers_write, self.start_timeout = workers_write, start_timeout
        self._remote: dict[str, Any] = {}  # store path and on_trace for the workers, per run
        self._started = False
        self._actors: list[Any] = []
        self._alive: list[int] = []  # indices (into _actors) of the actors still in the pool
        self._per: dict[str, float] = {}  # resources one actor holds, to see them freed on close
        self._spec: Any = None
        self._pids: list[int] = []
        self.stats: list[WorkerStats] = []
        self.wall_s = 0.0

    # -- lifecycle --------------------------------------------------------------------------
    def _resources(self) -> tuple[int, float, float, str]:
        """(workers, gpus, cpus per actor, device), the number of workers from the *free* resources."""
        ray = import_ray()
        total, free = ray.cluster_resources(), ray.available_resources()
        if float(total.get("GPU", 0)) > 0 and self.gpus_per_worker > 0:
            n = self.workers or max(1, int(float(free.get("GPU", 0)) // self.gpus_per_worker))
            return n, self.gpus_per_worker, self.cpus_per_worker, "cuda"
        n = self.workers or max(1, int(float(free.get("CPU", 0)) // self.cpus_per_worker))
        return n, 0.0, self.cpus_per_worker, "cpu"

    def _shortfall(self, n: int, gpus: float, cpus: float) -> str | None:
        """What `n` workers need and the cluster does not have free, e.g. "3 workers of 1 GPU asked, 2 GPUs
        free"; None when they fit."""
        free = import_ray().available_resources()
        for unit, per in (("GPU", gpus), ("CPU", cpus)):
            have = float(free.get(unit, 0))
            if per > 0 and n * per > have + 1e-9:
                return f"{n} workers of {per:g} {unit} asked, {have:g} {unit}{'' if have == 1 else 's'} free"
        return None

    def start(self, pair: Any) -> None:
        """Connect to Ray and start the actors for `pair` (a ModelPair or PairSpec); each loads it once.
        ExecutorError, naming what is missing, when they cannot all start within `start_timeout`."""
        spec = as_spec(pair)
        if self._alive and spec == self._spec:
            return
        self.close_actors()
        self._started = connect(self.address) or self._started
        ray = import_ray()
        n, gpus, cpus, device = self._resources()
        short = self._shortfall(n, gpus, cpus)
        advice = ("ask for fewer workers (--workers) or fewer GPUs per worker (--gpus-per-worker), or add nodes")
        if short and self._started:  # a local Ray this executor started: nothing will free up or join
            raise ExecutorError(f"Cannot start the Ray workers: {short} on this machine; {advice}.")
        if short:
            log.warning("%s; waiting up to %g s for the cluster to free or add them", short, self.start_timeout)
        threads = self.threads or max(1, int(cpus))
        spread = "auto" if gpus > 1 else None  # a pair larger than one GPU: device_map over the worker's GPUs
        cls = ray.remote(Worker).options(num_cpus=cpus, num_gpus=gpus, max_restarts=self.max_restarts,
                                         max_task_retries=-1)
        self._actors = [cls.remote(spec, device, threads, device_map=spread) for _ in range(n)]
        self._alive, self._spec, self._per = list(range(n)), spec, {"CPU": cpus, "GPU": gpus}
        refs = [a.where.remote() for a in self._actors]
        ready, waiting = ray.wait(refs, num_returns=n, timeout=self.start_timeout)
        if waiting:
            self._alive = [i for i, ref in enumerate(refs) if ref in ready]  # only these hold resources
            self.close_actors()
            why = short or "the others were still loading the pair"
            raise ExecutorError(f"Only {len(ready)} of {n} Ray workers started within {self.start_timeout:g} s: "
                                f"{why}. {advice[0].upper() + advice[1:]}, or give them longer (start_timeout).")
        try:
            where = ray.get(refs)
        except ray.exceptions.RayError as err:
            self.close_actors()
            raise ExecutorError(f"The Ray workers could not load the pair {spec.base} | {spec.reason}: "
                                f"{_cause(err)}") from err
        self.stats = [WorkerStats(f"w{i} {w['worker']}", w["device"]) for i, w in enumerate(where)]
        self._pids = [int(w["pid"]) for w in where]
        log.info("%d Ray workers on %s", n, ", ".join(s.worker for s in self.stats))

    def pids(self, wait_s: float = PIDS_WAIT_S) -> list[int]:
        """Process ids of the workers in the pool, asked now: a worker Ray restarted gives its new process;
        one still busy after `wait_s` seconds, the last id it reported."""
        ray = import_ray()
        refs = {a: self._actors[a].where.remote() for a in self._alive}
        if refs:
            ray.wait(list(refs.values()), num_returns=len(refs), timeout=wait_s)
        for a, ref in refs.items():
            if not ray.wait([ref], timeout=0)[0]:
                continue
            try:
                self._moved(a, ray.get(ref)["worker"])
            except ray.exceptions.ActorDiedError as err:
                self._leave(a, err)
            except ray.exceptions.RayError:  # unreachable just now: keep the last id
                pass
        return [self._pids[a] for a in self._alive]

    def close_actors(self) -> None:
        """Stop the actors and wait (briefly) until Ray reports their resources free again."""
        if not self._actors:
            return
        ray = import_ray()
        before = ray.available_resources()
        held = {unit: per * len(self._alive) for unit, per in self._per.items() if per}  # the dead hold nothing
        for actor in self._actors:
            ray.kill(actor)
        self._actors, self._alive = [], []
        deadline = time.monotonic() + RELEASE_WAIT_S
        while time.monotonic() < deadline:
            free = ray.available_resources()
            if all(float(free.get(u, 0)) + 1e-9 >= float(before.get(u, 0)) + h for u, h in held.items()):
                break
            time.sleep(0.05)

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

    # -- the pool ---------------------------------------------------------------------------
    def _moved(self, a: int, worker: str) -> bool:
        """Actor `a` answered from process `worker` ("host:pid"): follow it if Ray restarted it (True then)."""
        pid = int(worker.rsplit(":", 1)[1])
        if pid == self._pids[a]:
            return False
        log.warning("Ray worker w%d was restarted (process %d is now %s)", a, self._pids[a], worker)
        self._pids[a] = pid
        self.stats[a].worker = f"w{a} {worker}"
        return True

    def _leave(self, a: int, err: BaseException) -> None:
        """Actor `a` is dead for good (Ray used up its restarts): it leaves the pool."""
        if a not in self._alive:
            return
        self._alive.remove(a)
        self.stats[a].alive = False
        log.warning("Ray worker %s died and Ray cannot restart it (max_restarts=%d used up: %s); it leaves the "
                    "pool, %d worker(s) left", self.stats[a].worker, self.max_restarts, _cause(err), len(self._alive))

    def _lost(self, flight: dict[int, tuple[Any, int]]) -> list[int]:
        """Positions of the calls in flight whose actor died (their answer is an actor error); those actors
        leave the pool when Ray says they are dead for good."""
        ray = import_ray()
        refs = {ref: pos for pos, (ref, _) in flight.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        lost = []
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as err:
                pos = refs[ref]
                _, a = flight.pop(pos)
                if isinstance(err, ray.exceptions.ActorDiedError):
                    self._leave(a, err)
                lost.append(pos)
            except ray.exceptions.RayError:  # the call's own error: the pool raises it in its turn
                pass
        return lost

    def _map(self, method: str, calls: Sequence[tuple[tuple, dict]]) -> Iterator[tuple[int, Any, int, bool]]:
        """Yield (position, answer, actor, re-run) for each call `Worker.<method>(*args, **kwargs)` as it
        finishes, spread over the pool by Ray's ActorPool. "re-run": Ray restarted the actor and ran the call
        again: the first answer from the actor's new process (one call is in flight per actor, so the next call,
        which the pool may send before that answer is read here, ran once). A call whose actor died for good goes
        to another actor; none left: ExecutorError."""
        ray = import_ray()
        from ray.util import ActorPool

        pool = ActorPool([self._actors[a] for a in self._alive])
        index = {self._actors[a]: a for a in self._alive}
        flight: dict[int, tuple[Any, int]] = {}  # position -> (ref, actor)

        def send(actor: Any, pos: int) -> Any:
            args, kwargs = calls[pos]
            ref = actor.serve.remote(pos, method, args, kwargs)
            flight[pos] = (ref, index[actor])
            return ref

        for pos in range(len(calls)):
            pool.submit(send, pos)
        left = len(calls)
        while left:
            if not pool.has_next():  # calls wait, and no actor is left to take them
                raise ExecutorError(f"Every Ray worker died and Ray could not restart them (max_restarts="
                                    f"{self.max_restarts} each); {left} call(s) were not run. See the Ray logs "
                                    "(out of memory is the usual cause); the finished batches are stored.")
            try:
                pos, worker, answer = pool.get_next_unordered()
            except ray.exceptions.RayActorError:
                for pos in self._lost(flight):
                    pool.submit(send, pos)  # to a free actor, or queued for the next one that frees
                continue
            except ray.exceptions.RayTaskError as err:  # the call itself raised (e.g. a bad problem): the user's error
                raise err.as_instanceof_cause() from None
            _, a = flight.pop(pos)
            left -= 1
            yield pos, answer, a, self._moved(a, worker)

    # -- running ----------------------------------------------------------------------------
    @property
    def parallel(self) -> int:
        """Workers in the pool now (the driver sizes its windows of jobs on it)."""
        return len(self._alive)

    def keys(self, jobs: Sequence[GenerateJob]) -> list[list[str]]:
        """Every job's row keys (tokenising only), the jobs cut into a few chunks per actor."""
        size = max(1, math.ceil(len(jobs) / (4 * max(1, len(self._alive)))))
        chunks = [list(range(i, min(i + size, len(jobs)))) for i in range(0, len(jobs), size)]
        out: list[list[str]] = [[] for _ in jobs]
        for pos, keys, _, _ in self._map("keys", [(([jobs[j] for j in chunk],), {}) for chunk in chunks]):
            for j, k in zip(chunks[pos], keys):
                out[j] = k
        return out

    def run(self, pending: Sequence[tuple[GenerateJob, list[str]]], ids: Sequence[int]) -> Iterator[tuple]:
        """Yield (id, traces, info) as batches finish, one batch in flight per actor."""
        calls = [((job, skip), dict(self._remote)) for job, skip in pending]
        for pos, (traces, info), a, rerun in self._map("run", calls):
            self.stats[a].add(info)
            self.stats[a].retried += int(rerun)
            yield ids[pos], traces, info

    def run_jobs(self, pair: Any, jobs: Sequence[GenerateJob], *, store: Any = None,
                 on_trace: Callable[[Any], None] | None = None, progress: Progress | None = None,
                 should_stop: Callable[[], bool] | None = None, keep: str = "traces",
                 recheck: Callable[[dict[str, Any]], bool] | None = None,
                 on_rows: Callable[[int, list[Any]], None] | None = None) -> list[list[Any]]:
        """Per job, its traces (or summaries, keep="summaries"), made on the Ray workers, written here."""
        self.start(pair)
        t0 = time.perf_counter()
        path = getattr(store, "path", None)
        self._remote = {"store_path": str(path), "on_trace": on_trace} if self.workers_write and path else {}
        try:
            return drive(self, jobs, store, on_trace, progress, should_stop, keep=keep, recheck=recheck,
                         on_rows=on_rows)
        finally:
            self.wall_s += time.perf_counter() - t0
            self._remote = {}

    def summary(self) -> pd.DataFrame:
        """Per worker: jobs, units (rows), tokens, busy seconds, units/s, tokens/s, batches Ray re-ran after a
        restart, and whether it is still in the pool."""
        return pd.DataFrame([s.row() for s in self.stats])

def _cause(err: BaseException) -> str:
    text = (getattr(err, "message", None) or str(err)).strip().splitlines()
    return text[-1] if text else type(err).__name__
