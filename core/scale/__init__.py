"""Scale-out: the same generate / evaluate / import jobs in this process or across Ray workers.

    import core
    table = core.evaluate(pair, problems, policies, executor=core.RayExecutor(workers=8))

Ray is an optional extra (`pip install 'forkpoint[ray]'`); nothing here imports it until a Ray
executor or pipeline is used. See docs/SCALE.md.
"""

from core.scale.executors import InProcessExecutor, drive
from core.scale.jobs import GenerateJob, Worker, WorkerStats, make_jobs
from core.scale.ray_executor import RayExecutor, connect
from core.scale.spec import PairSpec, as_spec

__all__ = [
    "GenerateJob",
    "InProcessExecutor",
    "PairSpec",
    "RayExecutor",
    "Worker",
    "WorkerStats",
    "as_spec",
    "connect",
    "drive",
    "make_jobs",
]
