"""The listing of a store's trace files: which are readable, and their summaries.

A file whose identity (inode, size, mtime_ns) matches its index line was written by `TraceStore.put` as it is
now and is trusted; any other file is read in full (page and footer checksums) once per identity, and the
verdict kept in the index's scratch file. `TraceStore.summaries`, `listing` and `unreadable` read through here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from core.errors import StoreError
from core.io.branch_tree import children_index
from core.io.summary_index import Identity, SummaryIndex, identity
from core.io.tracefile import KEY_RE, READ_ERRORS, SUMMARY_COLUMNS, read_trace_record, reason
from core.trace import SCHEMA_VERSION


def check_file(index: SummaryIndex, key: str, path: Path, ident: Identity) -> tuple[dict[str, Any] | None, str | None]:
    """(summary, None) for a readable file, (None, reason) for a damaged one: read in full, once per identity
    (the verdict is kept in the index's scratch file, not in memory)."""
    found = index.verdict(key, ident)
    if found is not None:
        return found
    try:
        _, record, _ = read_trace_record(path, key)
        summary = record.get("summary")
        if not isinstance(summary, dict) or summary.get("key") != key:
            raise StoreError(f"Trace {key} ({path}) is unreadable: its footer has no summary for {key!r}")
        verdict: tuple[dict[str, Any] | None, str | None] = (summary, None)
    except StoreError as exc:
        verdict = (None, str(exc))
    index.set_verdict(key, ident, *verdict)
    return verdict


def stat_files(files: Iterable[os.DirEntry[str]]) -> list[tuple[os.DirEntry[str], os.stat_result]]:
    """Each file with its stat; a file deleted while listing is left out."""
    out = []
    for entry in files:
        try:
            out.append((entry, entry.stat()))
        except FileNotFoundError:
            continue
    return out


def summary_rows(index: SummaryIndex, files: Iterable[tuple[os.DirEntry[str], os.stat_result]]
                 ) -> tuple[list[dict[str, Any]], list[tuple[Path, str]]]:
    """(summaries of the readable trace files among `files` (`stat_files`), oldest first; [(path, reason)] for the
    rest): a file the index describes as it is on disk is trusted, any other is read in full once and the index
    repaired."""
    rows: list[dict[str, Any]] = []
    bad: list[tuple[Path, str]] = []
    named = []
    for entry, st in files:
        key = entry.name[: -len(".parquet")]
        if KEY_RE.match(key):
            named.append((entry, st, key, identity(st)))
        else:
            bad.append((Path(entry.path), f"file name {entry.name!r} is not a valid trace key"))
    believed = index.get_many([(key, ident) for _, _, key, ident in named])
    for (entry, st, key, ident), summary in zip(named, believed):
        if summary is None:  # not written by put as it is now: believe nothing before a full read
            try:
                summary, why = check_file(index, key, Path(entry.path), ident)
            except FileNotFoundError:
                continue
            except READ_ERRORS as exc:
                summary, why = None, reason(exc)
            if summary is None:
                bad.append((Path(entry.path), str(why)))
                continue
            index.remember(key, ident, summary)
            try:  # repair the cache for the next reader; harmless if it fails
                index.append(key, st, summary)
            except (OSError, StoreError):
                pass
        schema = summary.get("schema", SCHEMA_VERSION)
        if not isinstance(schema, int) or schema > SCHEMA_VERSION:
            bad.append((Path(entry.path), f"trace schema {schema!r} is newer than {SCHEMA_VERSION}"))
            continue
        rows.append(summary)
    rows.sort(key=lambda r: (str(r.get("created") or ""), r["key"]))
    return rows, bad


def unreadable_files(index: SummaryIndex, files: Iterable[os.DirEntry[str]]) -> list[tuple[Path, str]]:
    """(path, reason) for every trace file among `files` that cannot be fully read (each read in full, once
    per file identity); nothing is deleted."""
    out: list[tuple[Path, str]] = []
    for entry in files:
        key = entry.name[: -len(".parquet")]
        if not KEY_RE.match(key):
            out.append((Path(entry.path), f"file name {entry.name!r} is not a valid trace key"))
            continue
        try:
            ident = identity(entry.stat())
            _, why = check_file(index, key, Path(entry.path), ident)
        except FileNotFoundError:
            continue
        except READ_ERRORS as exc:
            why = reason(exc)
        if why is not None:
            out.append((Path(entry.path), why))
    return sorted(out)


class Listing:
    """One listing of a store: what it saw (the index file's identity, each file's name and identity), the
    readable files' summary rows (oldest first), the damaged files, and the rows as a frame, made once."""

    def __init__(self, seen: Any, rows: list[dict[str, Any]], bad: list[tuple[Path, str]]) -> None:
        self.seen, self.rows, self.bad = seen, rows, bad
        self._frame: pd.DataFrame | None = None
        self._children: dict[str, list[str]] | None = None

    def children(self, key: str) -> list[str]:
        """Keys of the traces whose parent is `key` (`branch_tree.children_index`, made once per listing: the
        Dataset page asks for the children of thousands of traces, and a scan of 5,600 rows took 38 ms each)."""
        return list(self.children_index().get(key, ()))

    def children_index(self) -> dict[str, list[str]]:
        """Each parent's children keys (`branch_tree.children_index`), made once per listing; read-only."""
        if self._children is None:
            self._children = children_index(self.rows)
        return self._children

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame (SUMMARY_COLUMNS), a copy the caller may change."""
        if self._frame is None:
            self._frame = pd.DataFrame(self.rows, columns=list(SUMMARY_COLUMNS))
        return self._frame.copy()
