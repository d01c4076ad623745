"""Store maintenance: `verify` (a deep integrity check) and `repair` (set damage aside, rebuild the index).

Nothing here deletes a trace: damaged files move to `<store>/damaged/`; only temp files of writers
that are gone are removed. Deleting traces is `TraceStore.remove`, on the user's explicit request.
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import StoreError, WriteError
from core.io.atomic import clean_temp_files, temp_files, write_atomic
from core.io.summary_index import identity, index_line
from core.io.tracefile import KEY_RE, read_trace_record

if TYPE_CHECKING:  # the store calls in here (TraceStore.verify/repair), so only the type is named
    from core.io.store import TraceStore

log = logging.getLogger(__name__)


@dataclass
class StoreCheck:
    """What `verify` found. `ok` is True when every trace file reads in full and the index is usable."""

    path: Path
    n_files: int = 0
    n_readable: int = 0
    damaged: list[tuple[Path, str]] = field(default_factory=list)
    without_checksum: list[str] = field(default_factory=list)  # readable files from an older forkpoint
    temp_files: list[tuple[Path, str]] = field(default_factory=list)  # (path, "stale" | "in use" | "removed ...")
    index_lines: int = 0
    bad_index_lines: int = 0
    index_error: str | None = None
    set_aside: list[Path] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.damaged and self.index_error is None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready report."""
        return {
            "store": str(self.path), "ok": self.ok, "files": self.n_files, "readable": self.n_readable,
            "damaged": [{"path": str(p), "reason": r} for p, r in self.damaged],
            "without_checksum": list(self.without_checksum),
            "temp_files": [{"path": str(p), "state": s} for p, s in self.temp_files],
            "index_lines": self.index_lines, "bad_index_lines": self.bad_index_lines,
            "index_error": self.index_error, "set_aside": [str(p) for p in self.set_aside],
        }  # fmt: skip


@dataclass
class RepairReport:
    """What `repair` did."""

    path: Path
    set_aside: list[tuple[str, Path, str]] = field(default_factory=list)  # (key, new path, reason)
    not_moved: list[tuple[Path, str]] = field(default_factory=list)  # damaged files left (e.g. bad names)
    removed_temp_files: list[Path] = field(default_factory=list)
    index_lines_before: int = 0
    index_lines_after: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready report."""
        return {
            "store": str(self.path),
            "set_aside": [{"key": k, "to": str(p), "reason": r} for k, p, r in self.set_aside],
            "not_moved": [{"path": str(p), "reason": r} for p, r in self.not_moved],
            "removed_temp_files": [str(p) for p in self.removed_temp_files],
            "index_lines_before": self.index_lines_before, "index_lines_after": self.index_lines_after,
        }  # fmt: skip


def verify(store: TraceStore) -> StoreCheck:
    """Read every trace file in full (page checksums, footer checksum, key), and check the index and temp files."""
    check = StoreCheck(store.path)
    for entry in store._files():
        check.n_files += 1
        key = entry.name[: -len(".parquet")]
        if not KEY_RE.match(key):
            check.damaged.append((Path(entry.path), f"file name {entry.name!r} is not a valid trace key"))
            continue
        try:
            _, _, checksum = read_trace_record(Path(entry.path), key)
        except FileNotFoundError:
            check.n_files -= 1
            continue
        except StoreError as exc:
            check.damaged.append((Path(entry.path), str(exc)))
            continue
        check.n_readable += 1
        if not checksum:
            check.without_checksum.append(key)
    check.damaged.sort()
    removed = [(p, "removed: left by a writer that died") for p in getattr(store, "removed_temp_files", [])]
    check.temp_files = removed + [(p, "stale" if stale else "in use") for p, stale in temp_files(store.traces_dir)]
    check.index_lines, check.bad_index_lines, check.index_error = store.index.stats()
    check.set_aside = store.set_aside_files()
    return check


def _rewrite_index(store: TraceStore) -> int:
    """Replace the index by one verified line per readable trace file; returns the line count."""
    lines: list[bytes] = []
    for entry in store._files():
        key = entry.name[: -len(".parquet")]
        if not KEY_RE.match(key):
            continue
        try:
            st = entry.stat()
            _, record, _ = read_trace_record(Path(entry.path), key)
        except (FileNotFoundError, StoreError):
            continue
        lines.append(index_line(key, identity(st), record["summary"]))
    fd = os.open(store.index_path, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # appenders wait; their lines then land in the replaced file (a cache)
        write_atomic(store.index_path, lambda fh: fh.writelines(lines), binary=True, what="store index")
    finally:
        os.close(fd)
    return len(lines)


def repair(store: TraceStore) -> RepairReport:
    """Set every damaged trace file aside (into damaged/), remove dead writers' temp files and rewrite
    the index from the readable files. A re-run then recomputes what was set aside."""
    report = RepairReport(store.path)
    if not store.exists():
        raise StoreError(f"No store at {store.path}")
    if store.index_path.is_dir():
        raise StoreError(f"{store.index_path} is a folder, not the index file; move it away, then repair")
    for path, why in verify(store).damaged:
        key = path.name[: -len(".parquet")]
        if not KEY_RE.match(key):
            report.not_moved.append((path, why))
            continue
        try:
            report.set_aside.append((key, store.set_aside(key, why), why))
        except WriteError as exc:
            report.not_moved.append((path, str(exc)))
    report.removed_temp_files, _ = clean_temp_files(store.traces_dir)
    report.index_lines_before = store.index.stats()[0]
    if store.traces_dir.is_dir():
        report.index_lines_after = _rewrite_index(store)
    log.info("repaired %s: %d file(s) set aside", store.path, len(report.set_aside))
    return report
