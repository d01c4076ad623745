"""One trace as one Parquet file: encoding, decoding, the checksum, and the small summary row.

Per-token values are Parquet columns (data pages carry page checksums). Everything else (meta, prompt
ids, JSON annotation layers, the summary) is one JSON blob in the schema metadata under "forkpoint",
and "forkpoint.sha256" is the SHA-256 of that blob plus the column layout (names, types, row count),
so a flipped bit anywhere in the record or the layout is caught when the footer is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from core.annotate.spikes import spikes_or_top
from core.errors import InvalidInputError, StoreError
from core.scoring.registry import DEFAULT_SCORE, SCORES, score_values
from core.trace import (
    SCHEMA_VERSION,
    SIDES,
    Trace,
    _json_default,
    answer_rule_of,
    decode_seconds,
    request_key,
)

STORE_FORMAT = 2  # 2: footer checksum. Bump on incompatible changes.
META_KEY = b"forkpoint"
SUM_KEY = b"forkpoint.sha256"
KEY_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")
_PROMPT_CHARS = 200
SUMMARY_COLUMNS: tuple[str, ...] = (
    "key", "problem", "prompt", "pair", "policy", "n_tokens", "max_score", "top100_mean",
    "n_spikes", "n_takeovers", "rho", "correct", "answer_rule", "grader", "parent", "branch_pos", "kind", "created",
    "decode_s", *(f"max_{s}" for s in SCORES), *(f"top100_{s}" for s in SCORES),
)  # fmt: skip
READ_ERRORS = (StoreError, OSError, ValueError, KeyError, TypeError, IndexError, pa.ArrowException)


def check_key(key: str) -> str:
    """Return `key` if it is safe as a file name (letters, digits, '_', '-', '.'), else raise."""
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise InvalidInputError(
            f"Invalid trace key {key!r}: use 1-128 letters, digits, '_', '-' or '.', not starting with '.'"
        )
    return key


def content_key(trace: Trace) -> str:
    """Key of a trace that has none: request_key of its meta (minus "key") and token ids."""
    meta = {name: value for name, value in trace.meta.items() if name != "key"}
    return request_key({"meta": meta, "token_ids": trace.token_ids.tolist()})


def reason(exc: BaseException) -> str:
    """An exception as 'Type: message' for damage reports."""
    return f"{type(exc).__name__}: {exc}"


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
    n_takeovers = trace.n_takeovers
    row: dict[str, Any] = {
        "key": key or trace.key,
        "problem": problem.get("id"),
        "prompt": prompt,
        "pair": f"{_short_model(pair.get('base'))}|{_short_model(pair.get('reason'))}",
        "policy": (meta.get("policy") or {}).get("name"),
        "n_tokens": n,
        "n_spikes": len(spikes_or_top(trace)),  # the rule the app and exports apply (one computation)
        "n_takeovers": n_takeovers,
        "rho": n_takeovers / n if n else 0.0,
        "correct": meta.get("correct"),
        "answer_rule": answer_rule_of(meta),
        "grader": meta.get("grader"),
        "parent": meta.get("parent"),
        "branch_pos": meta.get("branch_pos"),
        "kind": meta.get("kind"),
        "created": meta.get("created"),
        "decode_s": decode_seconds(meta),
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


def _type_text(dtype: pa.DataType) -> str:
    if pa.types.is_fixed_size_list(dtype):  # the child's name differs between writers ("item"/"element")
        return f"fixed_size_list<{_type_text(dtype.value_type)}>[{dtype.list_size}]"
    return str(dtype)


def checksum(blob: bytes, schema: pa.Schema, num_rows: int) -> bytes:
    """SHA-256 (hex, as bytes) of the footer record and the column layout it describes."""
    layout = ";".join(f"{f.name}:{_type_text(f.type)}" for f in schema) + f";rows={num_rows}"
    return hashlib.sha256(blob + b"\0" + layout.encode("utf-8")).hexdigest().encode("ascii")


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end]
        raise InvalidInputError(
            f"{what} holds {bad!r} (U+{ord(bad[0]):04X}), a lone surrogate that is not valid Unicode text"
        ) from exc


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
    blob = _utf8(json.dumps(record, default=_json_default, ensure_ascii=False), f"Trace {key}")
    try:
        table = pa.table(columns)
    except pa.ArrowException as exc:  # e.g. a lone surrogate in a token string
        raise InvalidInputError(f"Trace {key} cannot be stored: {reason(exc)}") from exc
    return table.replace_schema_metadata({META_KEY: blob, SUM_KEY: checksum(blob, table.schema, n)})


def _check_record(record: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise StoreError("footer metadata is not a JSON object")
    if int(record.get("store_format", 0)) > STORE_FORMAT:
        raise StoreError(f"store format {record['store_format']} is newer than this forkpoint's {STORE_FORMAT}")
    schema = record.get("schema", SCHEMA_VERSION)
    if not isinstance(schema, int) or schema > SCHEMA_VERSION:
        raise StoreError(f"trace schema {schema!r} is newer than this forkpoint's {SCHEMA_VERSION}; upgrade forkpoint")
    return record


def record_from_footer(metadata: dict[bytes, bytes] | None, schema: pa.Schema, num_rows: int) -> dict[str, Any]:
    """The footer record after checking its checksum (files of store format 1 have none)."""
    if not metadata or META_KEY not in metadata:
        raise StoreError("not a forkpoint trace file (no 'forkpoint' metadata)")
    blob = metadata[META_KEY]
    record = _check_record(json.loads(blob.decode("utf-8")))
    stored = metadata.get(SUM_KEY)
    if stored is None:
        if int(record.get("store_format", 0)) >= 2:
            raise StoreError("footer checksum is missing")
    elif stored != checksum(blob, schema, num_rows):
        raise StoreError("footer checksum mismatch: the trace's metadata or column layout was changed or damaged")
    return record


def read_footer_checksum(path: str | os.PathLike[str]) -> tuple[dict[str, Any], bytes]:
    """(checked footer record, stored checksum or b"" for an older file), reading no data pages."""
    md = pq.read_metadata(path)
    metadata = md.metadata or {}
    return record_from_footer(metadata, md.schema.to_arrow_schema(), md.num_rows), metadata.get(SUM_KEY, b"")


def decode(table: pa.Table, record: dict[str, Any] | None = None) -> Trace:
    """Inverse of `encode` (checks the footer checksum, unless given the `record_from_footer` of this table)."""
    if record is None:
        record = record_from_footer(table.schema.metadata, table.schema, table.num_rows)
    n, names = table.num_rows, set(table.column_names)

    def column(name: str) -> pa.ChunkedArray:
        if name not in names:
            raise StoreError(f"column {name!r} is missing")
        return table.column(name)

    def topk(name: str) -> np.ndarray:
        arr = column(name).combine_chunks()
        k = arr.type.list_size
        return arr.flatten().to_numpy(zero_copy_only=False).reshape(n, k)

    annotations = dict(record["annotations"])
    for name in record["annotation_columns"]:
        annotations[name] = column(f"ann:{name}").to_pylist()
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


def read_trace(path: Path, key: str) -> Trace:
    """Fully read and check one trace file (page checksums, footer checksum, key); StoreError with the reason."""
    return read_trace_record(path, key)[0]


@contextmanager
def _reading(path: Path, key: str) -> Iterator[None]:
    """A read of trace `key` at `path`: FileNotFoundError passes (gone, deleted or set aside meanwhile, not damaged:
    callers skip it); any other failure is a StoreError naming the file and why."""
    try:
        yield
    except FileNotFoundError:
        raise
    except StoreError as exc:
        raise StoreError(f"Trace {key} ({path}) is unreadable: {exc}") from exc
    except READ_ERRORS as exc:
        raise StoreError(f"Trace {key} ({path}) is unreadable: {reason(exc)}") from exc


def _check_holds(path: Path, key: str, held: Any) -> None:
    if held != key:
        raise StoreError(f"Trace file {path} holds key {held!r}, not {key!r}")


def read_trace_record(path: Path, key: str) -> tuple[Trace, dict[str, Any], bytes]:
    """(trace, footer record, stored checksum or b"" for an older file) after a full, checked read.
    StoreError when the file is damaged; FileNotFoundError when it is gone."""
    with _reading(path, key):
        with pq.ParquetFile(path, page_checksum_verification=True) as pf:  # lighter than read_table
            table = pf.read(use_threads=False)
        metadata = table.schema.metadata
        record = record_from_footer(metadata, table.schema, table.num_rows)
        trace = decode(table, record)  # the record parsed once: its "meta" is the trace's
    _check_holds(path, key, trace.key)
    return trace, record, metadata.get(SUM_KEY, b"")


def read_meta(path: Path, key: str) -> dict[str, Any]:
    """The meta of trace `key` from its file's footer alone (checked; no data page read), with the errors of
    `read_trace_record`."""
    with _reading(path, key):
        meta = read_footer_checksum(path)[0].get("meta")
        if not isinstance(meta, dict):
            raise StoreError("its footer has no meta")
    _check_holds(path, key, meta.get("key"))
    return meta


def write_table(table: pa.Table, fh: Any) -> None:
    """Write one encoded trace into an open binary file (page checksums on)."""
    pq.write_table(table, fh, write_page_checksum=True)
