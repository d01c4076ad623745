"""`TraceStore`: an embedded, content-addressed, crash-safe directory of traces.

Layout under the store root:
    traces/<key>.parquet   one trace: per-token columns; meta, prompt ids, annotation rules and a
                           small summary as JSON in the Parquet schema metadata (footer)
    index.jsonl            append-only cache of summaries, one line per write, each tagged with the
                           file identity (inode, size, mtime_ns) it describes

The Parquet files are the truth. A file appears only through `os.replace` of a fully written and
fsynced temp file, so a killed writer leaves the whole trace or nothing (plus, at worst, a stray
`.tmp-*` file, which is ignored). The index is only a cache: an entry counts when its identity
matches the file on disk; otherwise the summary is read from the file's footer (never the columns).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from core.metrics import DEFAULT_SCORE, SCORES, score_values
from core.errors import InvalidInputError, StoreError
from core.trace import SCHEMA_VERSION, SIDES, Trace, _json_default, request_key

log = logging.getLogger(__name__)

STORE_FORMAT = 1  # layout of one trace file; bump on incompatible changes
DEFAULT_STORE_DIR = "./forkpoint-store"
_META_KEY = b"forkpoint"
_KEY_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")
_PROMPT_CHARS = 200
SUMMARY_COLUMNS: tuple[str, ...] = (
    "key", "problem", "prompt", "pair", "policy", "n_tokens", "max_score", "top100_mean",
    "n_spikes", "n_takeovers", "rho", "correct", "parent", "branch_pos", "kind", "created",
    *(f"max_{s}" for s in SCORES), *(f"top100_{s}" for s in SCORES),
)  # fmt: skip

_INDEX_FIELDS = (*SUMMARY_COLUMNS, "schema")
_INDEX_TAG = zlib.crc32(",".join(_INDEX_FIELDS).encode())  # lines from another field layout are ignored


def default_store_path() -> Path:
    """The store directory for CLI/app edges: $FORKPOINT_STORE, else ./forkpoint-store."""
    return Path(os.environ.get("FORKPOINT_STORE") or DEFAULT_STORE_DIR)


def check_key(key: str) -> str:
    """Return `key` if it is safe as a file name (letters, digits, '_', '-', '.'), else raise."""
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise InvalidInputError(
            f"Invalid trace key {key!r}: use 1-128 letters, digits, '_', '-' or '.', not starting with '.'"
        )
    return key


def content_key(trace: Trace) -> str:
    """Key of a trace that has none: request_key of its meta (minus "key") and token ids."""
    meta = {name: value for name, value in trace.meta.items() if name != "key"}
    return request_key({"meta": meta, "token_ids": trace.token_ids.tolist()})


# -- summaries ----------------------------------------------------------------------------------


def _short_model(side: Any) -> str:
    name = str((side or {}).get("id") or "?") if isinstance(side, dict) else str(side or "?")
    return name.rstrip("/").rsplit("/", 1)[-1]


def _finite_or_none(value: float) -> float | None:
    return float(f"{value:.7g}") if np.isfinite(value) else None  # 7 digits keep the index lines short


def summarise(trace: Trace, key: str | None = None) -> dict[str, Any]:
    """The small per-trace summary row (see SUMMARY_COLUMNS), computed without touching the store."""
    meta = trace.meta
    problem = meta.get("problem") or {}
    pair = meta.get("pair") or {}
    prompt = problem.get("prompt")
    if isinstance(prompt, str) and len(prompt) > _PROMPT_CHARS:
        prompt = prompt[: _PROMPT_CHARS - 1] + "…"
    n = len(trace)
    n_takeovers = int(np.sum(np.asarray(trace.source, dtype=object) != "base")) if n else 0
    spikes = trace.annotations.get("spikes")
    row: dict[str, Any] = {
        "key": key or trace.key,
        "problem": problem.get("id"),
        "prompt": prompt,
        "pair": f"{_short_model(pair.get('base'))}|{_short_model(pair.get('reason'))}",
        "policy": (meta.get("policy") or {}).get("name"),
        "n_tokens": n,
        "n_spikes": len(spikes.get("positions", ())) if isinstance(spikes, dict) else 0,
        "n_takeovers": n_takeovers,
        "rho": n_takeovers / n if n else 0.0,
        "correct": meta.get("correct"),
        "parent": meta.get("parent"),
        "branch_pos": meta.get("branch_pos"),
        "kind": meta.get("kind"),
        "created": meta.get("created"),
        "schema": meta.get("schema", SCHEMA_VERSION),
    }
    for name in SCORES:
        values = np.asarray(score_values(trace.metrics, name), dtype=np.float64)
        values = np.sort(values[np.isfinite(values)])
        row[f"max_{name}"] = _finite_or_none(values[-1]) if values.size else None
        row[f"top100_{name}"] = _finite_or_none(values[-100:].mean()) if values.size else None
    row["max_score"] = row[f"max_{DEFAULT_SCORE}"]
    row["top100_mean"] = row[f"top100_{DEFAULT_SCORE}"]
    return row


# -- encoding one trace as an Arrow table ---------------------------------------------------------


def _topk_array(values: np.ndarray, n: int, dtype: pa.DataType) -> pa.Array:
    values = np.asarray(values)
    k = int(values.shape[1]) if values.ndim == 2 else 0
    flat = pa.array(values.reshape(n * k), type=dtype)
    return pa.FixedSizeListArray.from_arrays(flat, k)


def _per_token_strings(value: Any, n: int) -> bool:
    return (
        isinstance(value, (list, tuple, np.ndarray))
        and len(value) == n
        and all(v is None or isinstance(v, str) for v in value)
    )


def encode(trace: Trace, key: str, summary: dict[str, Any] | None = None) -> pa.Table:
    """One trace as an Arrow table: per-token columns, everything else as JSON in schema metadata."""
    n = len(trace)
    columns: dict[str, pa.Array] = {
        "token_id": pa.array(trace.token_ids, type=pa.int64()),
        "token": pa.array(list(trace.tokens), type=pa.string()),
        "source": pa.array([str(s) for s in trace.source], type=pa.string()),
    }
    for name, values in trace.metrics.items():
        columns[f"metric:{name}"] = pa.array(np.asarray(values))
    for side in SIDES:
        ids, probs = trace.topk[side]
        columns[f"topk_{side}_ids"] = _topk_array(np.asarray(ids, dtype=np.int64), n, pa.int64())
        probs = np.asarray(probs)
        columns[f"topk_{side}_probs"] = _topk_array(probs, n, pa.from_numpy_dtype(probs.dtype))
    json_layers: dict[str, Any] = {}
    column_layers: list[str] = []
    for name, layer in trace.annotations.items():
        if _per_token_strings(layer, n):
            columns[f"ann:{name}"] = pa.array(list(layer), type=pa.string())
            column_layers.append(name)
        else:
            json_layers[name] = layer
    spikes = trace.annotations.get("spikes")
    if isinstance(spikes, dict) and "positions" in spikes:  # a queryable mask; positions stay in JSON
        mask = np.zeros(n, dtype=bool)
        mask[[int(p) for p in spikes["positions"]]] = True
        columns["ann:spike"] = pa.array(mask)
    meta = {**trace.meta, "key": key}
    record = {
        "store_format": STORE_FORMAT,
        "schema": meta.get("schema", SCHEMA_VERSION),
        "key": key,
        "meta": meta,
        "prompt_ids": trace.prompt_ids,
        "annotations": json_layers,
        "annotation_columns": column_layers,
        "metric_columns": list(trace.metrics),
        "summary": summary if summary is not None else summarise(trace, key),
    }
    blob = json.dumps(record, default=_json_default, ensure_ascii=False).encode("utf-8")
    table = pa.table(columns)
    return table.replace_schema_metadata({_META_KEY: blob})


def _check_record(record: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise StoreError("footer metadata is not a JSON object")
    if int(record.get("store_format", 0)) > STORE_FORMAT:
        raise StoreError(f"store format {record['store_format']} is newer than this forkpoint's {STORE_FORMAT}")
    schema = record.get("schema", SCHEMA_VERSION)
    if not isinstance(schema, int) or schema > SCHEMA_VERSION:
        raise StoreError(f"trace schema {schema!r} is newer than this forkpoint's {SCHEMA_VERSION}; upgrade forkpoint")
    return record


def _record_from_metadata(metadata: dict[bytes, bytes] | None) -> dict[str, Any]:
    if not metadata or _META_KEY not in metadata:
        raise StoreError("not a forkpoint trace file (no 'forkpoint' metadata)")
    return _check_record(json.loads(metadata[_META_KEY].decode("utf-8")))


def decode(table: pa.Table) -> Trace:
    """Inverse of `encode`."""
    record = _record_from_metadata(table.schema.metadata)
    n = table.num_rows

    def column(name: str) -> pa.ChunkedArray:
        if name not in table.column_names:
            raise StoreError(f"column {name!r} is missing")
        return table.column(name)

    def topk(name: str) -> np.ndarray:
        arr = column(name).combine_chunks()
        k = arr.type.list_size
        return arr.flatten().to_numpy(zero_copy_only=False).reshape(n, k)

    annotations = dict(record["annotations"])
    for name in record["annotation_columns"]:
        annotations[name] = column(f"ann:{name}").to_pylist()
    # keep the original layer order: JSON layers first is fine for equality (dicts compare unordered)
    return Trace(
        token_ids=column("token_id").to_numpy(),
        tokens=column("token").to_pylist(),
        prompt_ids=record["prompt_ids"],
        metrics={m: column(f"metric:{m}").to_numpy(zero_copy_only=False) for m in record["metric_columns"]},
        topk={side: (topk(f"topk_{side}_ids"), topk(f"topk_{side}_probs")) for side in SIDES},
        source=np.array(column("source").to_pylist(), dtype=object),
        meta=record["meta"],
        annotations=annotations,
    )


# -- file-system helpers ----------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _branch_order(row: dict[str, Any]) -> tuple[Any, ...]:
    """Children by branch position (unknown last), then creation time, then key."""
    pos = row.get("branch_pos")
    return (pos is None, pos or 0, str(row.get("created") or ""), row["key"])


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class TraceStore:
    """An embedded, content-addressed directory of traces, safe against crashes and concurrent writers."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.traces_dir = self.path / "traces"
        self.index_path = self.path / "index.jsonl"
        self._index: dict[str, dict[tuple[int, int, int], dict[str, Any]]] = {}
        self._index_offset = 0
        self._verdicts: dict[tuple[str, tuple[int, int, int]], str | None] = {}
        self._warned: set[tuple[Path, str]] = set()

    def __repr__(self) -> str:
        return f"TraceStore({str(self.path)!r})"

    def _path(self, key: str) -> Path:
        return self.traces_dir / f"{check_key(key)}.parquet"

    # -- writing ----------------------------------------------------------------------------
    def put(self, trace: Trace, overwrite: bool = False) -> str:
        """Store `trace` under its key (derived from content if it has none); a no-op if the key exists."""
        key = check_key(trace.key) if trace.key else content_key(trace)
        schema = trace.meta.get("schema", SCHEMA_VERSION)
        if isinstance(schema, int) and schema > SCHEMA_VERSION:
            raise StoreError(f"Trace {key} has schema {schema}, newer than this forkpoint's {SCHEMA_VERSION}")
        path = self._path(key)
        if path.exists() and not overwrite:
            log.debug("trace %s already stored; not overwriting", key)
            return key
        summary = summarise(trace, key)
        table = encode(trace, key, summary)
        self.traces_dir.mkdir(parents=True, exist_ok=True)
        st = self._write_atomic(table, path)
        self._append_index(key, st, summary)
        log.info("stored trace %s (%d tokens)", key, len(trace))
        return key

    def _write_atomic(self, table: pa.Table, path: Path) -> os.stat_result:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                pq.write_table(table, fh, write_page_checksum=True)
                fh.flush()
                os.fsync(fh.fileno())
                st = os.fstat(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)
        return st

    def _append_index(self, key: str, st: os.stat_result, summary: dict[str, Any]) -> None:
        values = [summary.get(name) for name in _INDEX_FIELDS]  # a list, not a dict: half the bytes to parse
        line = json.dumps({"key": key, "id": list(_identity(st)), "f": _INDEX_TAG, "s": values}, default=_json_default)
        fd = os.open(self.index_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # one whole line per append, even across processes
            os.write(fd, (line + "\n").encode("utf-8"))
        finally:
            os.close(fd)  # closing releases the lock

    def delete(self, key: str) -> None:
        """Remove the trace `key` (only ever on the user's explicit request)."""
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            raise StoreError(f"No trace with key {key!r} in {self.path}") from None
        _fsync_dir(self.traces_dir)
        log.info("deleted trace %s", key)

    # -- reading ----------------------------------------------------------------------------
    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and bool(_KEY_RE.match(key)) and self._path(key).exists()

    def _files(self) -> Iterator[os.DirEntry[str]]:
        try:
            entries = os.scandir(self.traces_dir)
        except FileNotFoundError:
            return
        with entries:
            for entry in entries:
                if entry.name.endswith(".parquet") and not entry.name.startswith("."):
                    yield entry

    def keys(self) -> list[str]:
        """Keys of all trace files (readable or not), sorted."""
        return sorted(entry.name[: -len(".parquet")] for entry in self._files())

    def get(self, key: str) -> Trace:
        """The trace stored under `key`; StoreError if it is missing or unreadable (with the reason)."""
        path = self._path(key)
        if not path.exists():
            raise StoreError(f"No trace with key {key!r} in {self.path}")
        try:
            with pq.ParquetFile(path, page_checksum_verification=True) as pf:  # lighter than read_table
                trace = decode(pf.read(use_threads=False))
        except StoreError as exc:
            raise StoreError(f"Trace {key} ({path}) is unreadable: {exc}") from exc
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
            raise StoreError(f"Trace {key} ({path}) is unreadable: {_reason(exc)}") from exc
        if trace.key != key:
            raise StoreError(f"Trace file {path} holds key {trace.key!r}, not {key!r}")
        return trace

    def _refresh_index(self) -> None:
        try:
            size = self.index_path.stat().st_size
        except FileNotFoundError:
            self._index, self._index_offset = {}, 0
            return
        if size < self._index_offset:  # replaced or truncated behind our back: start over
            self._index, self._index_offset = {}, 0
        if size == self._index_offset:
            return
        with open(self.index_path, "rb") as fh:
            fh.seek(self._index_offset)
            data = fh.read(size - self._index_offset)
        end = data.rfind(b"\n") + 1  # a partly written last line is read next time
        lines = [line for line in data[:end].splitlines() if line.strip()]
        try:  # one parse for the whole batch is ~2x faster than a parse per line
            entries = json.loads(b"[" + b",".join(lines) + b"]")
        except ValueError:  # a torn line from a killed writer: parse line by line, skip the bad ones
            entries = []
            for raw in lines:
                try:
                    entries.append(json.loads(raw))
                except ValueError:
                    continue
        n_fields = len(_INDEX_FIELDS)
        for entry in entries:  # a skipped entry only costs a footer read later
            if (
                isinstance(entry, dict)
                and entry.get("f") == _INDEX_TAG  # written with these fields, in this order
                and isinstance(entry.get("s"), list)
                and len(entry["s"]) == n_fields
                and isinstance(entry.get("id"), list)
            ):
                summary = dict(zip(_INDEX_FIELDS, entry["s"]))
                self._index.setdefault(str(entry.get("key")), {})[tuple(entry["id"])] = summary
        self._index_offset += end

    def _summary_rows(self) -> tuple[list[dict[str, Any]], list[tuple[Path, str]]]:
        self._refresh_index()
        rows: list[dict[str, Any]] = []
        bad: list[tuple[Path, str]] = []
        for entry in self._files():
            key = entry.name[: -len(".parquet")]
            if not _KEY_RE.match(key):
                bad.append((Path(entry.path), f"file name {entry.name!r} is not a valid trace key"))
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:  # deleted while listing
                continue
            ident = _identity(st)
            summary = self._index.get(key, {}).get(ident)
            if summary is None:
                try:
                    record = _record_from_metadata(pq.read_metadata(entry.path).metadata)
                    summary = record["summary"]
                    if record.get("key") != key:
                        raise StoreError(f"file holds key {record.get('key')!r}, not {key!r}")
                except FileNotFoundError:
                    continue
                except (StoreError, OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
                    bad.append((Path(entry.path), _reason(exc)))
                    continue
                self._index.setdefault(key, {})[ident] = summary
                try:  # repair the cache for the next reader; harmless if it fails
                    self._append_index(key, st, summary)
                except OSError:
                    pass
            schema = summary.get("schema", SCHEMA_VERSION)
            if not isinstance(schema, int) or schema > SCHEMA_VERSION:
                bad.append((Path(entry.path), f"trace schema {schema!r} is newer than {SCHEMA_VERSION}"))
                continue
            rows.append(summary)
        rows.sort(key=lambda r: (str(r.get("created") or ""), r["key"]))
        return rows, bad

    def summaries(self) -> pd.DataFrame:
        """One row per readable trace (SUMMARY_COLUMNS), from the index/footers, never token arrays."""
        rows, bad = self._summary_rows()
        for path, reason in bad:
            if (path, reason) not in self._warned:  # once per file and reason, not on every listing
                self._warned.add((path, reason))
                log.warning("skipping unreadable trace file %s: %s", path, reason)
        return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))

    def unreadable(self) -> list[tuple[Path, str]]:
        """(path, reason) for every trace file that cannot be fully read; nothing is deleted."""
        out: list[tuple[Path, str]] = []
        for entry in self._files():
            try:
                ident = _identity(entry.stat())
            except FileNotFoundError:
                continue
            cache_key = (entry.name, ident)
            if cache_key not in self._verdicts:
                try:
                    self.get(entry.name[: -len(".parquet")])
                    self._verdicts[cache_key] = None
                except (StoreError, InvalidInputError) as exc:
                    self._verdicts[cache_key] = str(exc)
            if self._verdicts[cache_key] is not None:
                out.append((Path(entry.path), self._verdicts[cache_key]))
        return sorted(out)

    # -- branch trees -----------------------------------------------------------------------
    def children(self, key: str) -> list[str]:
        """Keys of the traces whose parent is `key`, by branch position then creation time."""
        rows, _ = self._summary_rows()
        return [r["key"] for r in sorted((r for r in rows if r.get("parent") == key), key=_branch_order)]

    def tree(self, key: str) -> dict[str, Any]:
        """The branch tree holding `key`: the oldest stored ancestor, with nested "children" lists."""
        rows, _ = self._summary_rows()
        by_key = {r["key"]: r for r in rows}
        if key not in by_key:
            raise StoreError(f"No readable trace with key {key!r} in {self.path}")
        kids: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            if r.get("parent"):
                kids.setdefault(r["parent"], []).append(r)
        root, seen = key, {key}
        while (parent := by_key[root].get("parent")) in by_key and parent not in seen:
            root = parent
            seen.add(root)

        def node(k: str, path: frozenset[str]) -> dict[str, Any]:
            r = by_key[k]
            ordered = sorted(kids.get(k, []), key=_branch_order)
            return {
                "key": k,
                "kind": r.get("kind"),
                "branch_pos": r.get("branch_pos"),
                "n_tokens": r.get("n_tokens"),
                "created": r.get("created"),
                "children": [node(c["key"], path | {k}) for c in ordered if c["key"] not in path | {k}],
            }

        return node(root, frozenset())
