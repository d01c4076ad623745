"""The store's summary index: an append-only JSONL cache of per-trace summaries, never the truth.

Each line: `{"key", "id": [inode, size, mtime_ns], "f": layout tag, "s": [summary values], "c": crc}`,
where `c` is the CRC-32 of the line's bytes before it. A line counts only when its CRC holds, its layout
tag is this version's and its file identity matches the file on disk; anything else (a torn line from
a killed writer, a line edited by hand, a line of another version) is skipped and counted in
`bad_lines`, and the store reads that trace's file in full instead.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import sqlite3
import stat
import tempfile
import threading
import weakref
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from core.errors import StoreError
from core.io.atomic import append_line, os_error_reason
from core.io.jsonsafe import dumps_strict
from core.io.tracefile import SUMMARY_COLUMNS

logger = logging.getLogger(__name__)

FIELDS = (*SUMMARY_COLUMNS, "schema")
TAG = zlib.crc32(("v2:" + ",".join(FIELDS)).encode())  # lines of another layout are ignored
_CRC_SEP = b', "c": '
READ_BYTES = 2 << 20  # index bytes parsed at a time (its parse peaks at ~5x that)
CACHE_KIB = 8192  # SQLite page cache of the scratch file
LOOKUP_CHUNK = 500  # keys per query of `get_many` (under SQLite's 999 bound variables of old builds)
Identity = tuple[int, int, int]


def identity(st: os.stat_result) -> Identity:
    """What ties an index line to one version of a file: (inode, size, mtime_ns)."""
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def index_line(key: str, ident: Identity, summary: dict[str, Any]) -> bytes:
    """One index line: key, file identity, layout tag, summary values, and a CRC over all of it."""
    values = [summary.get(name) for name in FIELDS]  # a list, not a dict: half the bytes to parse
    body = dumps_strict({"key": key, "id": list(ident), "f": TAG, "s": values}, ensure_ascii=True)[:-1]
    raw = body.encode("ascii")
    return raw + _CRC_SEP + str(zlib.crc32(raw)).encode("ascii") + b"}\n"


def line_ok(raw: bytes) -> bool:
    """Whether an index line's CRC matches its bytes (a torn, damaged or hand-edited line fails)."""
    cut = raw.rfind(_CRC_SEP)
    if cut < 0 or not raw.endswith(b"}"):
        return False
    try:
        return int(raw[cut + len(_CRC_SEP) : -1]) == zlib.crc32(raw[:cut])
    except ValueError:
        return False


def _parse(lines: list[bytes]) -> list[Any]:
    try:  # one parse for the whole batch is ~2x faster than a parse per line
        return json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        out = []
        for raw in lines:
            try:
                out.append(json.loads(raw))
            except ValueError:
                out.append(None)
        return out


class _Cache:
    """This process's SQLite scratch file of believed index entries and full-read verdicts (a derived cache,
    rebuilt from index.jsonl and the trace files). Unlinked as soon as it is open, so nothing is left behind.
    Where the temporary folder cannot hold it (missing, read-only, full), it is kept in memory instead: the
    store works on, with memory that grows with the index."""

    def __init__(self) -> None:
        self.pid, self.dir = os.getpid(), ":memory:"
        try:
            fd, self.dir = tempfile.mkstemp(prefix="forkpoint-index-", suffix=".sqlite")
            os.close(fd)
            try:
                self.db = self._open(self.dir)
            finally:
                os.unlink(self.dir)  # open and nameless: its space goes back when the process ends, even by kill -9
        except (OSError, sqlite3.Error) as exc:
            self.db = self._open(":memory:")
            _in_memory(exc)
        self.finalizer = weakref.finalize(self, _drop_cache, self.db, self.pid)

    @staticmethod
    def _open(name: str) -> sqlite3.Connection:
        db = sqlite3.connect(name, check_same_thread=False)
        # a scratch file: a crash loses nothing index.jsonl and the trace files do not hold, so no journal or fsync
        for pragma in ("journal_mode=OFF", "synchronous=OFF", "temp_store=FILE", f"cache_size=-{CACHE_KIB}"):
            db.execute(f"PRAGMA {pragma}")
        for table in ("entries", "verdicts"):  # identity: repr of the (inode, size, mtime_ns) tuple
            db.execute(f"CREATE TABLE IF NOT EXISTS {table} (key TEXT NOT NULL, ident TEXT NOT NULL, summary TEXT, "
                       "why TEXT, PRIMARY KEY (key, ident)) WITHOUT ROWID")
        return db

    def put(self, table: str, rows: list[tuple[str, str, str | None, str | None]]) -> None:
        if not rows:
            return
        try:
            with self.db:
                self.db.executemany(f"INSERT OR REPLACE INTO {table} VALUES (?, ?, ?, ?)", rows)
        except sqlite3.OperationalError as exc:  # the temporary folder filled up: go on in memory
            self._to_memory(exc)
            with self.db:
                self.db.executemany(f"INSERT OR REPLACE INTO {table} VALUES (?, ?, ?, ?)", rows)

    def _to_memory(self, exc: Exception) -> None:
        memory = self._open(":memory:")
        self.db.backup(memory)
        self.finalizer.detach()
        self.db.close()
        self.db = memory
        self.finalizer = weakref.finalize(self, _drop_cache, self.db, self.pid)
        _in_memory(exc)

    def get(self, table: str, key: str, ident: str) -> tuple[str | None, str | None] | None:
        return self.db.execute(f"SELECT summary, why FROM {table} WHERE key = ? AND ident = ?",
                               (key, ident)).fetchone()


def _in_memory(exc: Exception) -> None:
    logger.warning("The store index's scratch file cannot be kept in the temporary folder %s (%s); it is kept in "
                   "memory instead (set TMPDIR to a folder with free space to keep memory flat)",
                   tempfile.gettempdir(), exc)


def _drop_cache(db: sqlite3.Connection, pid: int) -> None:
    if os.getpid() == pid:  # a forked child leaves its parent's connection alone
        db.close()


def _ident(ident: Any) -> str:
    return repr(tuple(ident))


def _encode(summary: dict[str, Any] | list[Any]) -> str:
    return json.dumps(summary)


def _decode(text: str) -> dict[str, Any]:
    value = json.loads(text)
    return dict(zip(FIELDS, value)) if isinstance(value, list) else value  # a line's values, or a remembered dict


class _Entries(Mapping[str, dict[Identity, dict[str, Any]]]):
    """Read-only view of the believed entries: key -> {identity: summary} (read from SQLite on demand)."""

    def __init__(self, index: SummaryIndex) -> None:
        self.index = index

    def __getitem__(self, key: str) -> dict[Identity, dict[str, Any]]:
        with self.index._lock:
            rows = self.index._cache().db.execute("SELECT ident, summary FROM entries WHERE key = ?", (key,)).fetchall()
        if not rows:
            raise KeyError(key)
        return {ast.literal_eval(ident): _decode(summary) for ident, summary in rows}

    def __iter__(self) -> Iterator[str]:
        with self.index._lock:
            keys = [k for (k,) in self.index._cache().db.execute("SELECT DISTINCT key FROM entries ORDER BY key")]
        return iter(keys)

    def __len__(self) -> int:
        with self.index._lock:
            return self.index._cache().db.execute("SELECT COUNT(DISTINCT key) FROM entries").fetchone()[0]


class SummaryIndex:
    """One store's index file, read incrementally (only new bytes each time) into this process's SQLite
    scratch file, so what is held in memory does not grow with the number of stored traces."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bad_lines = 0  # lines seen whose CRC or layout did not hold (not believed)
        self._offset = 0
        self._ino = -1
        self._db: _Cache | None = None
        self._lock = threading.RLock()

    @property
    def entries(self) -> Mapping[str, dict[Identity, dict[str, Any]]]:
        """The believed entries, key -> {identity: summary} (a view over SQLite; for tests and tools)."""
        return _Entries(self)

    def _cache(self) -> _Cache:
        """The scratch database, opened on first use; a forked child opens its own and reads the file afresh."""
        if self._db is None or self._db.pid != os.getpid():
            if self._db is not None:  # inherited from the parent: never used, closed or removed here
                self._db.finalizer.detach()
                self._offset, self._ino, self.bad_lines = 0, -1, 0
            self._db = _Cache()
        return self._db

    def _clear(self) -> None:
        with self._cache().db as db:
            db.execute("DELETE FROM entries")

    def check_path(self) -> None:
        """StoreError when the index path is a folder (it is a file or absent in a healthy store)."""
        if self.path.is_dir():
            raise StoreError(
                f"{self.path} is a folder, not the store's index file; `forkpoint repair` sets it aside into "
                "damaged/ and rebuilds the index (a cache of the trace files: nothing is lost)"
            )

    def refresh(self) -> None:
        """Read lines appended since the last call (start over if the file was replaced or truncated)."""
        with self._lock:
            self._cache()
            try:
                st = self.path.stat()
            except FileNotFoundError:
                self._clear()
                self._offset = 0
                return
            if stat.S_ISDIR(st.st_mode):
                self.check_path()
            if st.st_size < self._offset or st.st_ino != self._ino:
                self._clear()
                self._offset, self._ino = 0, st.st_ino
            if st.st_size == self._offset:
                return
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(self._offset)
                    left, carry = st.st_size - self._offset, b""
                    while left > 0:  # in blocks: the new bytes are never all in memory at once
                        block = fh.read(min(READ_BYTES, left))
                        if not block:
                            break
                        left -= len(block)
                        data = carry + block
                        end = data.rfind(b"\n") + 1  # a partly written last line is read next time
                        self._take(data[:end])
                        self._offset += end
                        carry = data[end:]
            except OSError as exc:
                raise StoreError(f"Cannot read the store index {self.path}: {os_error_reason(exc)}") from exc

    def _take(self, data: bytes) -> None:
        """Believe the whole lines in `data` whose CRC and layout hold; count the others in bad_lines."""
        lines = []
        for raw in data.split(b"\n"):
            raw = raw.strip()
            if raw and line_ok(raw):
                lines.append(raw)
            elif raw:
                self.bad_lines += 1
        rows = []
        for entry in _parse(lines):
            if (
                isinstance(entry, dict)
                and entry.get("f") == TAG  # written with these fields, in this order
                and isinstance(entry.get("s"), list)
                and len(entry["s"]) == len(FIELDS)
                and isinstance(entry.get("id"), list)
            ):
                rows.append((str(entry.get("key")), _ident(entry["id"]), _encode(entry["s"]), None))
            else:
                self.bad_lines += 1
        self._cache().put("entries", rows)

    def get(self, key: str, ident: Identity) -> dict[str, Any] | None:
        """The summary of `key` if a believed line describes exactly this file version, else None."""
        with self._lock:
            self.refresh()
            found = self._cache().get("entries", key, _ident(ident))
        summary = _decode(found[0]) if found is not None and found[0] is not None else None
        return summary if summary is not None and summary.get("key") == key else None

    def get_many(self, files: list[tuple[str, Identity]]) -> list[dict[str, Any] | None]:
        """`get` of each (key, identity), the index read once and looked up a chunk of keys per query (a first
        listing of 20,000 traces made 20,000 queries and 20,000 stats of the index file)."""
        with self._lock:
            self.refresh()
        out: list[dict[str, Any] | None] = []
        for start in range(0, len(files), LOOKUP_CHUNK):  # one chunk's summaries in memory as text at a time
            chunk = files[start:start + LOOKUP_CHUNK]
            keys = sorted({key for key, _ in chunk})
            query = f"SELECT key, ident, summary FROM entries WHERE key IN ({','.join('?' * len(keys))})"
            with self._lock:
                found = {(k, i): text for k, i, text in self._cache().db.execute(query, keys)}
            for key, ident in chunk:
                text = found.get((key, _ident(ident)))
                summary = _decode(text) if text is not None else None
                out.append(summary if summary is not None and summary.get("key") == key else None)
        return out

    def remember(self, key: str, ident: Identity, summary: dict[str, Any]) -> None:
        """Believe a summary for this file version (without writing a line)."""
        with self._lock:
            self._cache().put("entries", [(key, _ident(ident), _encode(summary), None)])

    def verdict(self, key: str, ident: Identity) -> tuple[dict[str, Any] | None, str | None] | None:
        """(summary, None) or (None, reason) of a full read of this file version done here before, else None."""
        with self._lock:
            found = self._cache().get("verdicts", key, _ident(ident))
        if found is None:
            return None
        return (_decode(found[0]) if found[0] is not None else None), found[1]

    def set_verdict(self, key: str, ident: Identity, summary: dict[str, Any] | None, why: str | None) -> None:
        """Keep the outcome of a full read of this file version (kept when the index file is replaced)."""
        with self._lock:
            self._cache().put("verdicts", [(key, _ident(ident), None if summary is None else _encode(summary), why)])

    def file_identity(self) -> Identity | None:
        """The index file's identity (None while there is none): a listing kept from before is stale when it moved."""
        try:
            return identity(self.path.stat())
        except FileNotFoundError:
            return None

    def append(self, key: str, st: os.stat_result, summary: dict[str, Any]) -> None:
        """Append one line for this file version (OSError / StoreError on failure; the file is whole)."""
        self.check_path()
        append_line(self.path, index_line(key, identity(st), summary))

    def stats(self) -> tuple[int, int, str | None]:
        """(lines, lines whose CRC fails, error) of the whole file, read afresh."""
        if self.path.is_dir():
            return 0, 0, f"{self.path} is a folder, not the index file"
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return 0, 0, None
        except OSError as exc:
            return 0, 0, f"cannot read {self.path}: {os_error_reason(exc)}"
        lines = [line.strip() for line in data.split(b"\n") if line.strip()]
        return len(lines), sum(1 for line in lines if not line_ok(line)), None
