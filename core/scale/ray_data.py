"""Importing a large file of foreign rollouts with Ray Data: read -> score on an actor pool -> store.

    read_datasource(ForeignDatasource)       one streaming read task: the importer's own parser
                                             (same line numbers, limits and error messages)
    .map_batches(_Scorer, concurrency=n)     actors that load the pair once and score records
    .iter_batches() on the driver            in file order: duplicates, "already stored", writes

Ray Data streams: blocks flow through with back-pressure, so a million-row file is never held whole
(by the reader, the actors or the driver). The driver keeps `core.import_file`'s rules,
so the stored traces and the `ImportResult` are the ones an in-process import gives.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from core import settings
from core.errors import InvalidInputError
from core.evaluation.grading import grade_trace
from core.io.foreign import ForeignRecord, count_records, detect_format, iter_foreign
from core.io.imports import _Log, _Run, record_key
from core.io.store import TraceStore
from core.scale.jobs import Worker
from core.scale.ray_executor import RayExecutor, connect, import_ray
from core.scale.spec import as_spec
from core.scoring.teacher_forced import score
from core.settings import Progress

log = logging.getLogger(__name__)

ROWS_PER_BLOCK = 64  # records per block out of the reader (small: scoring, not reading, is the cost)
_COLUMNS = ("line", "id", "prompt", "response", "answer", "extra", "error")


def _block(rows: list[dict[str, Any]]) -> Any:
    import pyarrow as pa

    return pa.table({name: [r.get(name) for r in rows] for name in _COLUMNS},
                    schema=pa.schema([("line", pa.int64())] + [(n, pa.string()) for n in _COLUMNS[1:]]))


def read_blocks(path: str, fmt: str, rows_per_block: int = ROWS_PER_BLOCK) -> Iterator[Any]:
    """Arrow blocks of records from `iter_foreign` (a bad record is a row with a non-empty `error`);
    `response`, `answer` and `extra` travel as JSON text (a response may be text or token ids, an answer
    may be missing), so no column ever holds a null that a batch format could turn into NaN."""

    rows: list[dict[str, Any]] = []
    for item in iter_foreign(path, fmt):
        if isinstance(item, ForeignRecord):
            rows.append({"line": item.line, "id": item.id, "prompt": item.prompt, "response": json.dumps(item.response),
                         "answer": json.dumps(item.answer), "extra": json.dumps(item.extra), "error": ""})
        else:
            rows.append({"line": item[0], "id": "", "prompt": "", "response": "null", "answer": "null", "extra": "{}",
                         "error": item[1]})
        if len(rows) >= rows_per_block:
            yield _block(rows)
            rows = []
    if rows:
        yield _block(rows)


def _datasource(path: str, fmt: str, rows_per_block: int) -> Any:
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    class ForeignDatasource(Datasource):
        """One read task that streams the file through the importer's parser."""

        def estimate_inmemory_data_size(self) -> int | None:
            return None

        def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                           data_context: Any = None) -> list[Any]:
            meta = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None, input_files=(path,))
            return [ReadTask(lambda: read_blocks(path, fmt, rows_per_block), meta)]

    return ForeignDatasource()


class _Scorer:
    """A Ray Data actor: loads the pair once and scores each good record (`core.scoring.teacher_forced.score`, as the
    in-process import does); the trace, or the exception, goes back to the driver with the record."""

    def __init__(self, spec: Any, device: str, threads: int, store_path: str | None) -> None:

        self.pair = Worker(spec, device, threads).pair
        self.identity = self.pair.fingerprint()
        self.store = None
        if store_path is not None:

            self.store = TraceStore(store_path)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np


        results = []
        for i in range(len(batch["line"])):
            out: Any = None
            if not batch["error"][i]:
                rec = _record(batch, i)
                if self.store is None or record_key(rec, self.identity) not in self.store:
                    try:
                        out = score(self.pair, {"id": rec.id, "prompt": rec.prompt, "gold": rec.answer}, rec.response)
                    except Exception as exc:  # noqa: BLE001  reported for this record by the driver
                        out = exc
            results.append(out)
        identity = json.dumps(self.identity)
        return {**batch, "identity": np.array([identity] * len(results), dtype=object),
                "trace": np.array(results + [None], dtype=object)[:-1]}


def _record(batch: dict[str, Any], i: int) -> Any:

    return ForeignRecord(int(batch["line"][i]), str(batch["id"][i]), str(batch["prompt"][i]),
                         json.loads(batch["response"][i]), json.loads(batch["answer"][i]), json.loads(batch["extra"][i]))


def import_file_ray(pair: Any, path: str | os.PathLike[str], store: Any, *, executor: Any = None,
                    format: str | None = None, rows_per_block: int = ROWS_PER_BLOCK, batch_size: int = settings.BATCH_SIZE,
                    workers_see_store: bool | None = None, report_path: str | os.PathLike[str] | None = None,
                    progress: Progress | None = None) -> Any:
    """`core.import_file` on Ray: score the records of `path` on an actor pool (one pair per
    actor), and settle them here, in file order, by the importer's own rules (duplicates, already stored,
    failures, the report file). Returns the same `ImportResult` and stores the same traces.

    `workers_see_store`: the actors skip records already in the store themselves (True when the store is
    on a filesystem every node sees; default: True for a local Ray, False when joining a cluster).
    The executor's generation actors, if any, are stopped first: the pipeline starts its own pool."""

    executor = executor or RayExecutor()
    fmt = detect_format(path, format)
    if not Path(path).is_file():
        raise InvalidInputError(f"No such file: {path}")
    executor._started = connect(executor.address) or executor._started
    executor.close_actors()
    ray = import_ray()
    n, gpus, cpus, device = executor._resources()
    threads = executor.threads or max(1, int(cpus))
    if workers_see_store is None:
        workers_see_store = executor.address is None
    store_path = str(store.path) if workers_see_store and hasattr(store, "path") else None
    # a Dataset copies the current DataContext when it is made: set the file order before making it
    ctx = ray.data.DataContext.get_current()
    saved = (ctx.execution_options.preserve_order, ctx.enable_progress_bars)
    ctx.execution_options.preserve_order, ctx.enable_progress_bars = True, False
    try:
        ds = ray.data.read_datasource(_datasource(str(path), fmt, rows_per_block), num_cpus=0)
        ds = ds.map_batches(_Scorer, fn_constructor_kwargs={"spec": as_spec(pair), "device": device,
                                                            "threads": threads, "store_path": store_path},
                            batch_size=batch_size, concurrency=n, num_cpus=cpus, num_gpus=gpus, batch_format="numpy")
        if not ds.context.execution_options.preserve_order:  # pragma: no cover - a Ray that ignores it
            raise InvalidInputError("this Ray version does not keep a Dataset's order; import without --ray")
        return _settle(pair, ds.iter_batches(batch_size=None, batch_format="numpy"), store, Path(path).name,
                       count_records(path, fmt), report_path, progress)
    finally:
        ctx.execution_options.preserve_order, ctx.enable_progress_bars = saved


def _settle(pair: Any, batches: Iterator[dict[str, Any]], store: Any, source: str, total: int,
            report_path: Any, progress: Progress | None) -> Any:
    """Feed the scored rows, in file order, through the in-process importer's bookkeeping (`_Run`): its
    `score_fn` hands back what the worker made, so stored traces and outcomes are the in-process ones."""

    made: list[Any] = [None]

    def worker_made(_pair: Any, _problem: Any, _response: Any) -> Any:
        if isinstance(made[0], BaseException):
            raise made[0]
        if made[0] is None:
            raise InvalidInputError("a worker skipped this record as stored, but the store does not hold it")
        return made[0]

    run = _Run(pair, store, worker_made, source, _Log(report_path), grade_trace)
    with run.settling() as result:
        for batch in batches:
            for i in range(len(batch["line"])):
                line = int(batch["line"][i])
                run.identity = json.loads(batch["identity"][i])  # the workers' pair fingerprint
                result.last_line = line
                if batch["error"][i]:
                    run.outcome("failed", line, why=str(batch["error"][i]))
                else:
                    made[0] = batch["trace"][i]
                    run.record(_record(batch, i))
                if progress is not None:
                    progress(line, max(total, line))
    return result
