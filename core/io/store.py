"""`TraceStore`: an embedded, content-addressed, crash-safe directory of traces.

Layout under the store root:
    traces/<key>.parquet   one trace (see core/io/tracefile.py: columns, footer record, checksum)
    index.jsonl            append-only cache of summaries, one line per write, each tagged with the
                           file identity (inode, size, mtime_ns) it describes and a CRC of the line
    damaged/               damaged trace files set aside by a re-run, `put` or `repair` (never deleted),
                           and damaged side files (e.g. notes/<key>.json) set aside by `repair`
    calibration/           a store of its own (this layout again): the gate calibration's base rollouts,
                           kept apart from the user's traces and reused by the next calibration

The Parquet files are the truth. A file appears only through `write_atomic` (temp file, fsync,
rename), so a killed writer leaves the whole trace or nothing, plus at worst a temp file, which the
next open removes. The index is only a cache: an entry counts when its CRC holds and its identity
matches the file on disk; any other file is read in full (page and footer checksums) before it is
listed, so a file changed since it was written is never listed as healthy unchecked. Bit rot that
keeps a file's identity is found by `verify()`.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from core.errors import InvalidInputError, StoreError, WriteError
from core.io import branch_tree
from core.io.atomic import clean_temp_files, fsync_dir, os_error_reason, write_atomic
from core.io.listing import Listing, check_file, stat_files, summary_rows, unreadable_files
from core.io.summary_index import Identity, SummaryIndex, identity, index_line
from core.io.tracefile import (  # noqa: F401  (re-exported: the store's public names)
    KEY_RE,
    READ_ERRORS,
    STORE_FORMAT,
    SUM_KEY,
    SUMMARY_COLUMNS,
    check_key,
    content_key,
    decode,
    encode,
    read_footer_checksum,
    read_meta,
    read_trace,
    read_trace_record,
    reason,
    summarise,
    write_table,
)  # fmt: skip
from core.trace import SCHEMA_VERSION, Trace

log = logging.getLogger(__name__)

DEFAULT_STORE_DIR = "./forkpoint-store"
CALIBRATION_DIR = "calibration"


def default_store_path() -> Path:
    """The store directory for CLI/app edges: $FORKPOINT_STORE, else ./forkpoint-store."""
    return Path(os.environ.get("FORKPOINT_STORE") or DEFAULT_STORE_DIR)


class TraceStore:
    """An embedded, content-addressed directory of traces, safe against crashes and concurrent writers.

    Opening one removes temp files left by killed writers (`removed_temp_files` lists them).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.traces_dir = self.path / "traces"
        self.damaged_dir = self.path / "damaged"
        self.index_path = self.path / "index.jsonl"
        self.index = SummaryIndex(self.index_path)
        self._warned: set[tuple[Path, str]] = set()
        self._held: tuple[str, Identity, Trace] | None = None  # decoded by `in`, handed out once by get()
        self._listed: Listing | None = None  # see _listing
        self._lock = threading.Lock()
        self.n_written, self.last_written = 0, ""  # what this object stored (named when a later write fails)
        self._calibration: TraceStore | None = None
        self.removed_temp_files: list[Path] = []
        self.live_temp_files: list[Path] = []
        if self.traces_dir.is_dir():
            self.removed_temp_files, self.live_temp_files = clean_temp_files(self.traces_dir)
            for tmp in self.removed_temp_files:
                log.info("removed %s, left by a writer that was killed", tmp)

    def __repr__(self) -> str:
        return f"TraceStore({str(self.path)!r})"

    def exists(self) -> bool:
        """Whether the store folder exists (a store is created by its first `put`)."""
        return self.path.is_dir()

    def calibration_store(self) -> TraceStore:
        """The store of the gate calibration's base rollouts (`calibration/` under this one): made when a gate
        is calibrated, never listed or analysed with the user's own traces, reused by the next calibration."""
        if self._calibration is None:
            self._calibration = TraceStore(self.path / CALIBRATION_DIR)
        return self._calibration

    def _path(self, key: str) -> Path:
        return self.traces_dir / f"{check_key(key)}.parquet"

    # -- writing ----------------------------------------------------------------------------
    def put(self, trace: Trace, overwrite: bool = False) -> str:
        """Store `trace` under its key (from content if it has none); returns the key.

        An existing readable trace stays unless overwrite=True (identical content is never rewritten);
        an existing damaged file is set aside in damaged/ and replaced. WriteError (disk full, ...)
        means this trace was not stored; a failed index append does not (the index is a cache).
        """
        key = check_key(trace.key) if trace.key else content_key(trace)
        schema = trace.meta.get("schema", SCHEMA_VERSION)
        if isinstance(schema, int) and schema > SCHEMA_VERSION:
            raise StoreError(f"Trace {key} has schema {schema}, newer than this forkpoint's {SCHEMA_VERSION}")
        path = self._path(key)
        summary = summarise(trace, key)
        table = encode(trace, key, summary)
        if path.exists():
            existing = self._existing_checksum(key, path)
            if existing is not None and (not overwrite or existing == table.schema.metadata[SUM_KEY]):
                log.debug("trace %s already stored; not rewriting", key)
                return key
        self._mkdirs()
        try:
            st = write_atomic(path, lambda fh: write_table(table, fh), binary=True, what=f"trace {key}")
        except WriteError as exc:
            raise WriteError(f"{exc}. The {self.n_written} trace(s) stored before it by this process are kept "
                             f"(last: {self.last_written or 'none'}); rerun to continue") from exc
        self.n_written, self.last_written = self.n_written + 1, key
        self._drop_held(key)
        try:
            self.index.append(key, st, summary)
        except (OSError, StoreError) as exc:  # the trace is stored; its summary is read from the file instead
            why = os_error_reason(exc) if isinstance(exc, OSError) else str(exc)
            log.warning("trace %s stored, but its index line was not written (%s)", key, why)
        log.info("stored trace %s (%d tokens)", key, len(trace))
        return key

    def _mkdirs(self) -> None:
        try:
            self.traces_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriteError(f"Cannot create the store folder {self.traces_dir}: {os_error_reason(exc)}") from exc

    def _existing_checksum(self, key: str, path: Path) -> bytes | None:
        """The stored checksum of the readable file at `path` (b"" for older files), or None when
        there is none any more (gone, or damaged and now set aside)."""
        try:
            ident = identity(path.stat())
        except FileNotFoundError:
            return None
        try:
            trusted = self.index.get(key, ident) is not None  # written by put and unchanged since
        except StoreError:  # an unusable index only costs a full read
            trusted = False
        try:
            return read_footer_checksum(path)[1] if trusted else read_trace_record(path, key)[2]
        except FileNotFoundError:
            return None
        except READ_ERRORS as exc:
            try:
                self.set_aside(key, str(exc))
            except StoreError:  # another writer moved it first
                pass
            return None

    def set_aside(self, key: str, why: str = "") -> Path:
        """Move the trace file `key` into damaged/ (kept for the user, out of the way of a rewrite)."""
        path = self._path(key)
        target = self._move_aside(path, f"{key}.{_stamp()}.parquet", f"No trace with key {key!r} in {self.path}",
                                  f"Cannot move damaged trace {path} aside")
        self._drop_held(key)
        log.warning("set damaged trace %s aside as %s%s", key, target, f" ({why})" if why else "")
        return target

    def set_aside_side_file(self, path: str | os.PathLike[str], why: str = "") -> Path:
        """Move a damaged side file of this store (e.g. `notes/<key>.json`) into damaged/ as
        `<name>.<folder>.<time><suffix>`: kept for the user, out of the way of the next write."""
        path = Path(path)
        if path.parent.parent != self.path:
            raise StoreError(f"{path} is not a side file of the store {self.path}")
        target = self._move_aside(path, f"{path.stem}.{path.parent.name}.{_stamp()}{path.suffix}",
                                  f"No file {path} in {self.path}", f"Cannot move damaged file {path} aside")
        log.warning("set damaged side file %s aside as %s%s", path, target, f" ({why})" if why else "")
        return target

    def set_aside_index_folder(self) -> Path:
        """Move a folder that stands where the index file goes into damaged/ (kept; the index is rebuilt)."""
        target = self._move_aside(self.index_path, f"{self.index_path.name}.folder.{_stamp()}",
                                  f"No folder {self.index_path}", f"Cannot move {self.index_path} aside")
        log.warning("set the folder %s, in place of the store's index, aside as %s", self.index_path, target)
        return target

    def _move_aside(self, path: Path, name: str, missing: str, failed: str) -> Path:
        """Move `path` into damaged/ as `name` (durably); `missing` / `failed` are the errors' messages."""
        target = self.damaged_dir / name
        try:
            self.damaged_dir.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
            fsync_dir(path.parent)
        except FileNotFoundError:
            raise StoreError(missing) from None
        except OSError as exc:
            raise WriteError(f"{failed}: {os_error_reason(exc)}") from exc
        return target

    def rebuild_index(self) -> int:
        """Replace the index by one verified line per readable trace file (read in full); returns the line count."""
        if self.index_path.is_dir():
            raise StoreError(f"{self.index_path} is a folder, not the index file; move it away, then repair")
        lines: list[bytes] = []
        for key, path in self.trace_files():
            if not KEY_RE.match(key):
                continue
            try:
                st = path.stat()
                _, record, _ = read_trace_record(path, key)
            except (FileNotFoundError, StoreError):
                continue
            lines.append(index_line(key, identity(st), record["summary"]))
        fd = os.open(self.index_path, os.O_RDONLY | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # appenders wait; their lines then land in the replaced file (a cache)
            write_atomic(self.index_path, lambda fh: fh.writelines(lines), binary=True, what="store index")
        finally:
            os.close(fd)
        return len(lines)

    @property
    def bad_index_lines(self) -> int:
        """Index lines seen so far that were not believed (torn, damaged, edited, other version)."""
        return self.index.bad_lines

    def delete(self, key: str) -> None:
        """Remove the trace `key` (only ever on the user's explicit request)."""
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            raise StoreError(f"No trace with key {key!r} in {self.path}") from None
        except OSError as exc:
            raise WriteError(f"Cannot remove {path}: {os_error_reason(exc)}") from exc
        self._drop_held(key)
        fsync_dir(self.traces_dir)
        log.info("deleted trace %s", key)

    def remove(self, keys: Iterable[str]) -> list[str]:
        """Delete the traces `keys` (readable or damaged); returns the keys removed. Missing keys raise."""
        keys = list(keys)
        missing = [k for k in keys if not self._path(k).exists()]
        if missing:
            raise StoreError(f"No trace with key {missing[0]!r} in {self.path}; nothing was removed")
        for key in keys:
            self.delete(key)
        return keys

    def remove_unreadable(self) -> list[Path]:
        """Delete every trace file that fails the deep check (only on the user's explicit request)."""
        removed = []
        for path, why in self.unreadable():
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise WriteError(f"Cannot remove {path}: {os_error_reason(exc)}") from exc
            removed.append(path)
            log.info("deleted unreadable trace file %s (%s)", path, why)
        if removed:
            fsync_dir(self.traces_dir)
        return removed

    # -- reading ----------------------------------------------------------------------------
    def __contains__(self, key: object) -> bool:
        """Whether a *readable* trace is stored under `key` (a damaged file counts as absent, so a
        re-run recomputes it and `put` replaces it). The trace read here is handed to the next get()."""
        if not (isinstance(key, str) and KEY_RE.match(key)):
            return False
        path = self._path(key)
        try:
            ident = identity(path.stat())
            trace = read_trace(path, key)
        except (FileNotFoundError, StoreError):
            return False
        with self._lock:
            self._held = (key, ident, trace)
        return True

    def summary(self, key: str) -> dict[str, Any] | None:
        """The summary row (SUMMARY_COLUMNS) of the readable trace under `key`, or None (absent or damaged):
        `in` without decoding the tokens. The index answers for a file `put` wrote and nothing changed since;
        any other file is read in full once, as `summaries()` does."""
        if not (isinstance(key, str) and KEY_RE.match(key)):
            return None
        path = self._path(key)
        try:
            ident = identity(path.stat())
            found = self.index.get(key, ident)
            if found is None:
                found, _ = self._check_file(key, path, ident)
        except (FileNotFoundError, *READ_ERRORS):
            return None
        return found

    def damage_of(self, key: str) -> str | None:
        """Why the file stored under `key` cannot be read, or None when it reads or no file is there
        (so an edge can say "damaged: run forkpoint verify / repair" rather than "not in the store")."""
        if not (isinstance(key, str) and KEY_RE.match(key)):
            return None
        try:
            read_trace(self._path(key), key)
        except FileNotFoundError:
            return None
        except StoreError as exc:
            return str(exc)
        return None

    def _drop_held(self, key: str) -> None:
        with self._lock:
            if self._held is not None and self._held[0] == key:
                self._held = None

    def _files(self) -> Iterator[os.DirEntry[str]]:
        try:
            entries = os.scandir(self.traces_dir)
        except FileNotFoundError:
            return
        except NotADirectoryError:
            raise StoreError(f"{self.traces_dir} is not a folder; this is not a forkpoint store") from None
        with entries:
            for entry in entries:
                if entry.name.endswith(".parquet") and not entry.name.startswith("."):
                    yield entry

    def trace_files(self) -> Iterator[tuple[str, Path]]:
        """(name without ".parquet", path) of every trace file in traces/, readable or not, valid key or not."""
        for entry in self._files():
            yield entry.name[: -len(".parquet")], Path(entry.path)

    def keys(self) -> list[str]:
        """Keys of all trace files (readable or not), sorted."""
        return sorted(entry.name[: -len(".parquet")] for entry in self._files())

    def get(self, key: str) -> Trace:
        """The trace stored under `key`; StoreError if it is missing or unreadable (with the reason)."""
        path = self._path(key)
        try:
            ident = identity(path.stat())
        except FileNotFoundError:
            raise StoreError(f"No trace with key {key!r} in {self.path}") from None
        with self._lock:
            held, self._held = self._held, None
        if held is not None and held[0] == key and held[1] == ident:
            return held[2]
        try:
            return read_trace(path, key)
        except FileNotFoundError:  # removed since the stat
            raise StoreError(f"No trace with key {key!r} in {self.path}") from None

    def meta(self, key: str) -> dict[str, Any]:
        """The meta of the trace under `key` from its file's footer alone (checked, no token data read): what a
        query over many traces asks before it reads the few it needs; StoreError if missing or unreadable."""
        try:
            return read_meta(self._path(key), key)
        except FileNotFoundError:
            raise StoreError(f"No trace with key {key!r} in {self.path}") from None

    def _check_file(self, key: str, path: Path, ident: Identity) -> tuple[dict[str, Any] | None, str | None]:
        return check_file(self.index, key, path, ident)

    def _listing(self) -> Listing:
        """`summary_rows` of every trace file. The last listing is kept and given again while the folder holds
        the same files with the same identities and the index file is unchanged: a listing then costs a stat per
        file, not an index lookup and a decode per file (the app lists the store several times per click). It
        holds about what one listing returns (~2 KB a trace, and its frame once asked for) for the life of this
        object. Read-only: callers that hand rows out copy them (`_summary_rows`, `summaries`)."""
        files = stat_files(self._files())
        seen = (self.index.file_identity(), [(entry.name, identity(st)) for entry, st in files])  # scandir's order:
        with self._lock:  # another order for the same files only lists them again
            kept = self._listed
        if kept is None or kept.seen != seen:
            kept = Listing(seen, *summary_rows(self.index, files))
            with self._lock:
                self._listed = kept
        return kept

    def _summary_rows(self) -> tuple[list[dict[str, Any]], list[tuple[Path, str]]]:
        """(summary rows of the readable traces, oldest first, [(path, reason)] for the others), as copies."""
        kept = self._listing()
        return [dict(row) for row in kept.rows], list(kept.bad)

    def summaries(self) -> pd.DataFrame:
        """One row per readable trace (SUMMARY_COLUMNS), from the index/footers, never token arrays."""
        kept = self._listing()
        for path, why in kept.bad:
            if (path, why) not in self._warned:  # once per file and reason, not on every listing
                self._warned.add((path, why))
                log.warning("skipping unreadable trace file %s: %s", path, why)
        return kept.frame()

    def listing(self) -> tuple[pd.DataFrame, list[tuple[Path, str]]]:
        """(summaries of the readable traces, [(path, reason)] for files that failed), in one pass.

        Files unchanged since `put` wrote them are trusted; every other file is read in full.
        """
        kept = self._listing()
        return kept.frame(), sorted(kept.bad)

    def unreadable(self, deep: bool = True) -> list[tuple[Path, str]]:
        """(path, reason) for every trace file that cannot be fully read; nothing is deleted.

        deep=True reads every file in full (cached per file identity within this object); deep=False
        trusts files unchanged since `put` wrote them, as `listing()` does.
        """
        if not deep:
            return self.listing()[1]
        return unreadable_files(self.index, self._files())

    def load_all(self, keys: Iterable[str] | None = None) -> tuple[list[Trace], list[tuple[Path, str]]]:
        """(readable traces, [(path, reason)] for the ones that failed), for `keys` or every file.

        For batch readers (export-all, analyze): one damaged file is reported, never fatal.
        """
        traces: list[Trace] = []
        bad: list[tuple[Path, str]] = []
        for key in self.keys() if keys is None else keys:
            try:
                traces.append(self.get(key))
            except (StoreError, InvalidInputError) as exc:
                bad.append((self.traces_dir / f"{key}.parquet", str(exc)))
        return traces, bad

    def set_aside_files(self) -> list[Path]:
        """Damaged files (or a folder found where a side file belongs) kept in damaged/ by earlier rewrites or `repair`."""
        try:
            return sorted(p for p in self.damaged_dir.iterdir() if not p.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []

    # -- branch trees (core/io/branch_tree.py, over the summaries) ---------------------------
    def root_of(self, problem_id: str) -> str | None:
        """Key of the oldest stored trace of a problem that is not a branch (None when there is none)."""
        return branch_tree.root_of(self._listing().rows, problem_id)

    def children(self, key: str) -> list[str]:
        """Keys of the traces whose parent is `key`, by branch position then creation time."""
        return self._listing().children(key)

    def children_index(self) -> dict[str, list[str]]:
        """`children` of every parent from one listing (a listing stats every file: for many traces, ask once)."""
        return self._listing().children_index()

    def tree(self, key: str) -> dict[str, Any]:
        """The branch tree holding `key`: the oldest stored ancestor, with nested "children" lists."""
        listing = self._listing()
        if not any(r["key"] == key for r in listing.rows):
            raise StoreError(f"No readable trace with key {key!r} in {self.path}")
        return branch_tree.tree(listing.rows, key, listing.children_index())


def _stamp() -> str:
    """A UTC time stamp for a file set aside (microseconds: two in one second never collide)."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%f")
