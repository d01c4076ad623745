"""Store maintenance: `verify` (a deep integrity check) and `repair` (set damage aside, rebuild the index).

Nothing here deletes a trace: damaged files move to `<store>/damaged/`; only temp files of writers
that are gone are removed. Deleting traces is `TraceStore.remove`, on the user's explicit request.
Side files (`SIDE_FILES`: notes, and any later kind) are checked and set aside like trace files, one by
one. Everything goes through the store's public API; the store does not know this module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import StoreError, WriteError
from core.io.atomic import clean_temp_files, temp_files
from core.io.notes import unreadable_notes
from core.io.store import TraceStore
from core.io.tracefile import KEY_RE, read_trace_record

log = logging.getLogger(__name__)

# Every kind of side file a store holds beside its traces: name -> (store -> [(path, reason)] of the damaged ones).
SIDE_FILES: dict[str, Callable[[TraceStore], list[tuple[Path, str]]]] = {"notes": unreadable_notes}


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
    damaged_side_files: list[tuple[Path, str]] = field(default_factory=list)  # notes, ... that cannot be read
    calibration: StoreCheck | None = None  # the store's calibration store (calibration/), when it has one

    @property
    def ok(self) -> bool:
        return (not self.damaged and not self.damaged_side_files and self.index_error is None
                and (self.calibration is None or self.calibration.ok))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready report."""
        return {
            "store": str(self.path), "ok": self.ok, "files": self.n_files, "readable": self.n_readable,
            "damaged": [{"path": str(p), "reason": r} for p, r in self.damaged],
            "without_checksum": list(self.without_checksum),
            "temp_files": [{"path": str(p), "state": s} for p, s in self.temp_files],
            "index_lines": self.index_lines, "bad_index_lines": self.bad_index_lines,
            "index_error": self.index_error, "set_aside": [str(p) for p in self.set_aside],
            "damaged_side_files": [{"path": str(p), "reason": r} for p, r in self.damaged_side_files],
            **({"calibration": self.calibration.to_dict()} if self.calibration is not None else {}),
        }  # fmt: skip


@dataclass
class RepairReport:
    """What `repair` did."""

    path: Path
    set_aside: list[tuple[str, Path, str]] = field(default_factory=list)  # (key, new path, reason)
    not_moved: list[tuple[Path, str]] = field(default_factory=list)  # files that are no trace (bad names): left
    failed: list[tuple[Path, str]] = field(default_factory=list)  # damaged files that could not be moved (why)
    removed_temp_files: list[Path] = field(default_factory=list)
    index_lines_before: int = 0
    index_lines_after: int = 0
    calibration: RepairReport | None = None  # the store's calibration store (calibration/), when it has one

    @property
    def ok(self) -> bool:
        """True when every damaged file found was moved aside (False: some are still in the way)."""
        return not self.failed and (self.calibration is None or self.calibration.ok)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready report."""
        return {
            "store": str(self.path), "ok": self.ok,
            "set_aside": [{"key": k, "to": str(p), "reason": r} for k, p, r in self.set_aside],
            "not_moved": [{"path": str(p), "reason": r} for p, r in self.not_moved],
            "failed": [{"path": str(p), "reason": r} for p, r in self.failed],
            "removed_temp_files": [str(p) for p in self.removed_temp_files],
            "index_lines_before": self.index_lines_before, "index_lines_after": self.index_lines_after,
            **({"calibration": self.calibration.to_dict()} if self.calibration is not None else {}),
        }  # fmt: skip


def damaged_side_files(store: TraceStore) -> list[tuple[Path, str]]:
    """(path, reason) of every side file (SIDE_FILES) of the store that cannot be read."""
    return sorted(found for check in SIDE_FILES.values() for found in check(store))


def _calibration(store: TraceStore) -> TraceStore | None:
    """The store's calibration store when there is one (a store of its own, checked and repaired the same way)."""
    rollouts = store.calibration_store()
    return rollouts if rollouts.exists() else None


def verify(store: TraceStore) -> StoreCheck:
    """Read every trace file in full (page checksums, footer checksum, key), every side file, and check
    the index and temp files; the same for the store's calibration store."""
    check = StoreCheck(store.path)
    rollouts = _calibration(store)
    if rollouts is not None:
        check.calibration = verify(rollouts)
    for key, path in store.trace_files():
        check.n_files += 1
        if not KEY_RE.match(key):
            check.damaged.append((path, f"file name {path.name!r} is not a valid trace key"))
            continue
        try:
            _, _, checksum = read_trace_record(path, key)
        except FileNotFoundError:
            check.n_files -= 1
            continue
        except StoreError as exc:
            check.damaged.append((path, str(exc)))
            continue
        check.n_readable += 1
        if not checksum:
            check.without_checksum.append(key)
    check.damaged.sort()
    check.damaged_side_files = damaged_side_files(store)
    removed = [(p, "removed: left by a writer that died") for p in store.removed_temp_files]
    check.temp_files = removed + [(p, "stale" if stale else "in use") for p, stale in temp_files(store.traces_dir)]
    check.index_lines, check.bad_index_lines, check.index_error = store.index.stats()
    check.set_aside = store.set_aside_files()
    return check


def repair(store: TraceStore) -> RepairReport:
    """Set every damaged trace file and side file aside (into damaged/), remove dead writers' temp files
    and rewrite the index from the readable files (the store's calibration store too). A re-run then recomputes
    what was set aside."""
    report = RepairReport(store.path)
    if not store.exists():
        raise StoreError(f"No store at {store.path}")
    rollouts = _calibration(store)
    if rollouts is not None:
        report.calibration = repair(rollouts)
    if store.index_path.is_dir():  # the index is a cache: the folder is set aside like a damaged file, kept
        report.set_aside.append(("index", store.set_aside_index_folder(), "a folder in place of the index file"))
    check = verify(store)
    for path, why in check.damaged:
        key = path.name[: -len(".parquet")]
        if not KEY_RE.match(key):
            report.not_moved.append((path, why))
            continue
        try:
            report.set_aside.append((key, store.set_aside(key, why), why))
        except (StoreError, WriteError) as exc:
            report.failed.append((path, str(exc)))
    for path, why in check.damaged_side_files:
        try:
            report.set_aside.append((path.stem, store.set_aside_side_file(path, why), why))
        except (StoreError, WriteError) as exc:
            report.failed.append((path, str(exc)))
    report.removed_temp_files, _ = clean_temp_files(store.traces_dir)
    report.index_lines_before = store.index.stats()[0]
    if store.traces_dir.is_dir():
        report.index_lines_after = store.rebuild_index()
    log.info("repaired %s: %d file(s) set aside", store.path, len(report.set_aside))
    return report
