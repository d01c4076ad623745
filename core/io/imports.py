"""Imports of responses made elsewhere: `{id, prompt, response[, answer]}` records scored into a store.

Each record is handled on its own (reading: core/io/foreign.py). A record's identity is what makes it
distinct to the user: (id, answer, prompt, response, pair), and its trace key is derived from exactly
that. Records differing in any of these are two traces; an identical repeat in the file is skipped
as a duplicate; a record already in the store is skipped without being scored again (so re-running
an interrupted import finishes it). The result says what was stored, skipped and failed, also after
Ctrl-C, a cancel or a full disk; with `report_path` every outcome is appended to a JSONL file as it
happens, so even a killed import leaves an account that matches the store.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import ForkpointError, GradingError, StoreError, WriteError
from core.io.atomic import os_error_reason
from core.io.foreign import (  # noqa: F401  (re-exported)
    IMPORT_FORMATS,
    MAX_DEPTH,
    MAX_LINE_BYTES,
    ForeignRecord,
    count_records,
    detect_format,
    iter_foreign,
    json_depth_exceeds,
    read_foreign_jsonl,
)
from core.io.jsonsafe import dumps_strict
from core.record.request import request
from core.scoring.teacher_forced import score
from core.settings import Progress
from core.trace import Trace, request_key

log = logging.getLogger(__name__)


def failure_reason(exc: Exception) -> str:
    """Why a record failed, as the report says it: a core error's message alone (its class is no news to a
    user); any other error's class too, since that is all a bare KeyError('x') or an empty message says."""
    if isinstance(exc, ForkpointError) and str(exc).strip():
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc).strip() else type(exc).__name__


@dataclass
class ImportResult:
    """What an import did, by line (row) number: stored (line, key), skipped (line, key, why),
    failed (line, reason), notes (line, text); `stopped` says why it ended early (None: it read all)."""

    stored: list[tuple[int, str]] = field(default_factory=list)
    skipped: list[tuple[int, str, str]] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)
    notes: list[tuple[int, str]] = field(default_factory=list)
    stopped: str | None = None
    last_line: int = 0  # the last line read; lines after it were not read when `stopped` is set

    @property
    def keys(self) -> list[str]:
        """Keys stored by this import, in file order."""
        return [key for _, key in self.stored]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: counts, then {"line", "key"/"reason"} lists, and why it stopped early (if it did)."""
        return {
            "stored": len(self.stored), "skipped": len(self.skipped), "failed": len(self.errors),
            "complete": self.stopped is None, "stopped": self.stopped,
            "last_line": self.last_line, "keys": self.keys,
            "errors": [{"line": line, "reason": why} for line, why in self.errors],
            "skipped_records": [{"line": line, "key": key, "reason": why} for line, key, why in self.skipped],
            "notes": [{"line": line, "note": text} for line, text in self.notes],
        }  # fmt: skip


def _pair_identity(pair: Any) -> Any:
    fingerprint = getattr(pair, "fingerprint", None)
    return fingerprint() if callable(fingerprint) else repr(pair)


def record_key(rec: ForeignRecord, pair_identity: Any) -> str:
    """The trace key of an imported record: from (id, answer, prompt, response, pair), nothing else."""
    return request_key(request("import", pair_identity, id=rec.id, answer=rec.answer, prompt=rec.prompt,
                               response=rec.response))


class _Log:
    """Appends one JSON line per outcome to the report file (flushed, so a killed import leaves it).

    A failed write (full disk, ...) raises WriteError once, naming the report; the log then stays quiet
    so that settling the import never fails a second time."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.fh, self.path, self.failed = None, path, False
        if path is not None:
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                self.fh = open(path, "a", encoding="utf-8")
            except OSError as exc:
                raise WriteError(f"Cannot write the import report {path}: {os_error_reason(exc)}") from exc

    def __call__(self, **entry: Any) -> None:
        if self.fh is None or self.failed:
            return
        try:
            good = os.path.getsize(self.path)  # a torn line is cut back off, so the report stays whole lines
        except OSError:
            good = None
        try:
            self.fh.write(dumps_strict(entry, ensure_ascii=True) + "\n")
            self.fh.flush()
        except OSError as exc:
            self.failed = True
            if good is not None:
                with contextlib.suppress(OSError):
                    os.truncate(self.path, good)
            raise WriteError(f"Cannot write the import report {self.path}: {os_error_reason(exc)}; the store "
                             "holds exactly the records the report says stored") from exc

    @property
    def writing(self) -> bool:
        """Whether outcomes reach a report file (False: no report, or it failed and the log is quiet)."""
        return self.fh is not None

    def close(self) -> None:
        if self.fh is not None:
            try:
                self.fh.close()
            except OSError:  # the buffered tail could not be written: the report says less, the store is whole
                self.failed = True


class _Run:
    """One import's state: outcomes so far, what was seen, and the record being stored right now."""

    def __init__(self, pair: Any, store: Any, score_fn: Callable[..., Trace], source: str, log_entry: _Log,
                 grade: Callable[[Trace], Any] | None = None) -> None:
        self.pair, self.store, self.score_fn, self.source, self.log = pair, store, score_fn, source, log_entry
        self.grader = grade
        self.identity = _pair_identity(pair)
        self.result = ImportResult()
        self.first_seen: dict[str, int] = {}  # record key -> first line
        self.ids: dict[str, tuple[int, str]] = {}  # id -> (first line, record key)
        self.in_flight: tuple[int, str] | None = None

    def outcome(self, status: str, line: int, key: str | None = None, why: str | None = None) -> None:
        """Record one line's outcome in the result and the report file."""
        if self.in_flight is not None and self.in_flight[0] == line:
            self.in_flight = None  # settled: a failing report write after this must not settle it twice
        if status == "stored" and self.log.writing:
            try:
                if self.log.failed:
                    raise WriteError(f"the import report {self.log.path} could not be written")
                self.log(line=line, status=status, key=key)
            except WriteError as exc:
                self.unstore(line, str(key), exc)
                raise
            self.result.stored.append((line, str(key)))
            return
        if status == "stored":
            self.result.stored.append((line, str(key)))
        elif status == "skipped":
            self.result.skipped.append((line, str(key), str(why)))
        else:
            self.result.errors.append((line, str(why)))
        self.log(line=line, status=status, **({"key": key} if key else {}), **({"reason": why} if why else {}))

    def unstore(self, line: int, key: str, why: Exception) -> None:
        """Take back the trace this import just stored when its report line cannot be written, so that the
        report matches the store (a re-run stores it again); if even that fails, the result says so."""
        try:
            self.store.delete(key)
        except (StoreError, WriteError) as exc:
            self.result.stored.append((line, key))
            self.result.notes.append((line, f"stored, but not in the report ({why}); removing it failed: {exc}"))
            return
        self.result.errors.append((line, f"not kept: its report line could not be written ({why}); rerun to store it"))

    def record(self, rec: ForeignRecord) -> None:
        """Store one good record unless it is a duplicate or already stored."""
        key = record_key(rec, self.identity)
        if rec.id in self.ids and self.ids[rec.id][1] != key:
            self.result.notes.append((rec.line, f"id {rec.id!r} also on line {self.ids[rec.id][0]}, with other content"))
        self.ids.setdefault(rec.id, (rec.line, key))
        if key in self.first_seen:
            return self.outcome("skipped", rec.line, key, f"duplicate of line {self.first_seen[key]}")
        self.first_seen[key] = rec.line
        if key in self.store:
            return self.outcome("skipped", rec.line, key, "already in the store (not scored again)")
        self.in_flight = (rec.line, key)
        self.score_and_put(rec, key)
        self.in_flight = None

    def score_and_put(self, rec: ForeignRecord, key: str) -> None:
        """Score and store one record; WriteError (disk full) propagates to stop the import."""
        try:
            trace = self.score_fn(self.pair, {"id": rec.id, "prompt": rec.prompt, "gold": rec.answer}, rec.response)
            trace = trace.annotate()  # a copy: the scorer's trace is left alone
            trace.meta.update(kind="import", key=key)
            trace.meta["import"] = {"file": self.source, "line": rec.line, "id": rec.id, "extra": rec.extra}
            if rec.answer is not None and self.grader is not None:
                self.grade(trace, rec.line)
            self.store.put(trace)
        except WriteError:
            raise
        except Exception as exc:  # noqa: BLE001  one record's failure (any kind) never takes the rest down
            if not type(exc).__module__.startswith("core"):
                log.warning("line %d: %s", rec.line, exc, exc_info=True)
            return self.outcome("failed", rec.line, why=failure_reason(exc))
        self.outcome("stored", rec.line, key)

    def grade(self, trace: Trace, line: int) -> None:
        """Grade against the record's answer (as generated traces are); a grader that cannot run leaves
        the trace ungraded with a note, never unstored."""

        try:
            self.grader(trace)
        except GradingError as exc:
            self.result.notes.append((line, f"not graded: {exc}"))

    @contextlib.contextmanager
    def settling(self) -> Iterator[ImportResult]:
        """Run the record loop inside: Ctrl-C or a full disk ends it with `result.stopped` saying where,
        and whatever happens the in-flight record is settled and the report closed (`finish`)."""
        try:
            yield self.result
        except KeyboardInterrupt:
            self.result.stopped = f"interrupted (Ctrl-C) at line {self.result.last_line}"
        except WriteError as exc:
            self.result.stopped = f"stopped at line {self.result.last_line}: {exc}"
        finally:
            self.finish()

    def finish(self) -> ImportResult:
        """Settle a record interrupted while storing (the store says whether it got there) and close the log."""
        result = self.result
        try:
            if self.in_flight is not None:
                line, key = self.in_flight
                if key in self.store:
                    self.outcome("stored", line, key)
                else:
                    self.outcome("failed", line, why=result.stopped or "interrupted while storing")
            self.log(status="end", complete=result.stopped is None, stopped=result.stopped,
                     stored=len(result.stored), skipped=len(result.skipped), failed=len(result.errors))
        except WriteError as exc:  # the report itself could not be finished (e.g. the disk filled up)
            result.stopped = result.stopped or f"stopped after line {result.last_line}: {exc}"
        self.log.close()
        if self.log.failed and result.stopped is None:
            result.stopped = f"stopped after line {result.last_line}: the import report {self.log.path} is incomplete"
        result.errors.sort()
        return result


def import_records(
    pair: Any,
    path: str | os.PathLike[str],
    store: Any,
    score_fn: Callable[..., Trace] | None = None,
    progress: Progress | None = None,
    *,
    format: str | None = None,
    report_path: str | os.PathLike[str] | None = None,
    should_stop: Callable[[], bool] | None = None,
    grade: Callable[[Trace], Any] | None = None,
) -> ImportResult:
    """Score each record with `score_fn(pair, {"id", "prompt", "gold"}, response)` (default
    `core.scoring.teacher_forced.score`), mark it kind="import", call the `grade` hook on it when the record gives an
    answer (`core.import_file` passes `grade_trace`; a `GradingError` leaves a note and the trace ungraded) and put it
    in `store`, one record at a time. The hook keeps grading out of the store's room.

    Never raises for a bad record, a failed scoring, Ctrl-C or a full disk: the result says what
    happened. `progress(lines done, lines total)`; `should_stop()` is asked before each record.
    """
    score_fn = score_fn or score
    fmt = detect_format(path, format)
    records = iter_foreign(path, fmt)  # raises InvalidInputError for a missing or unusable file
    total = count_records(path, fmt) if progress is not None else 0
    run = _Run(pair, store, score_fn, Path(path).name, _Log(report_path), grade)
    with run.settling() as result:
        for item in records:
            line = item.line if isinstance(item, ForeignRecord) else item[0]
            if should_stop is not None and should_stop():
                result.stopped = f"cancelled before line {line}"
                break
            result.last_line = line
            if isinstance(item, ForeignRecord):
                run.record(item)
            else:
                run.outcome("failed", line, why=item[1])
            if progress is not None:
                progress(line, max(total, line))
    return result

