"""The store's summary index: an append-only JSONL cache of per-trace summaries, never the truth.

Each line: `{"key", "id": [inode, size, mtime_ns], "f": layout tag, "s": [summary values], "c": crc}`,
where `c` is the CRC-32 of the line's bytes before it. A line counts only when its CRC holds, its layout
tag is this version's and its file identity matches the file on disk; anything else (a torn line from
a killed writer, a line edited by hand, a line of another version) is skipped and counted in
`bad_lines`, and the store reads that trace's file in full instead.
"""

from __future__ import annotations

import json
import os
import stat
import zlib
from pathlib import Path
from typing import Any

from core.errors import StoreError
from core.io.atomic import append_line, os_error_reason
from core.io.jsonsafe import dumps_strict
from core.io.tracefile import SUMMARY_COLUMNS

FIELDS = (*SUMMARY_COLUMNS, "schema")
TAG = zlib.crc32(("v2:" + ",".join(FIELDS)).encode())  # lines of another layout are ignored
_CRC_SEP = b', "c": '
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


class SummaryIndex:
    """The in-memory view of one store's index file, read incrementally (only new bytes each time)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[Identity, dict[str, Any]]] = {}
        self.bad_lines = 0  # lines seen whose CRC or layout did not hold (not believed)
        self._offset = 0
        self._ino = -1

    def check_path(self) -> None:
        """StoreError when the index path is a folder (it is a file or absent in a healthy store)."""
        if self.path.is_dir():
            raise StoreError(
                f"{self.path} is a folder, not the store's index file; move it away "
                "(the index is a cache: it is rebuilt from the trace files)"
            )

    def refresh(self) -> None:
        """Read lines appended since the last call (start over if the file was replaced or truncated)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self.entries, self._offset = {}, 0
            return
        if stat.S_ISDIR(st.st_mode):
            self.check_path()
        if st.st_size < self._offset or st.st_ino != self._ino:
            self.entries, self._offset, self._ino = {}, 0, st.st_ino
        if st.st_size == self._offset:
            return
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read(st.st_size - self._offset)
        except OSError as exc:
            raise StoreError(f"Cannot read the store index {self.path}: {os_error_reason(exc)}") from exc
        end = data.rfind(b"\n") + 1  # a partly written last line is read next time
        lines = []
        for raw in data[:end].split(b"\n"):
            raw = raw.strip()
            if raw and line_ok(raw):
                lines.append(raw)
            elif raw:
                self.bad_lines += 1
        for entry in _parse(lines):
            if (
                isinstance(entry, dict)
                and entry.get("f") == TAG  # written with these fields, in this order
                and isinstance(entry.get("s"), list)
                and len(entry["s"]) == len(FIELDS)
                and isinstance(entry.get("id"), list)
            ):
                self.remember(str(entry.get("key")), tuple(entry["id"]), dict(zip(FIELDS, entry["s"])))
            else:
                self.bad_lines += 1
        self._offset += end

    def get(self, key: str, ident: Identity) -> dict[str, Any] | None:
        """The summary of `key` if a believed line describes exactly this file version, else None."""
        self.refresh()
        summary = self.entries.get(key, {}).get(ident)
        return summary if summary is not None and summary.get("key") == key else None

    def remember(self, key: str, ident: Identity, summary: dict[str, Any]) -> None:
        """Hold a summary in memory (without writing a line)."""
        self.entries.setdefault(key, {})[ident] = summary

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
