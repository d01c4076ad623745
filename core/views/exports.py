"""Files others open: JSONL (lossless), CSV and Parquet (one row per token), self-contained HTML.
(Reading files made elsewhere is `core/io/imports.py`.)

Every export carries the reproducibility record (each trace's meta plus the exporting forkpoint's
version). All model text that reaches HTML goes through `core.views.heatmap` or `html.escape`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from core.annotate.rank_shift import rank_shift
from core.annotate.shown import annotated  # noqa: F401  (re-exported: its home before)
from core.errors import InvalidInputError, OutputExistsError
from core.io.atomic import clean_temp_files, make_folders, remove_empty, write_atomic
from core.io.csvsafe import write_csv
from core.io.jsonsafe import dumps_strict, floats_in
from core.io.provenance import forkpoint_version, utc_now
from core.scoring.registry import DEFAULT_SCORE, check_score
from core.trace import SIDES, Trace
from core.views.heatmap import tag_colour
from core.views.html_page import html_page

log = logging.getLogger(__name__)

JSONL_VERSION = 1  # the `forkpoint_trace` field of each JSONL line
PER_TOKEN_LAYERS = ("tags", "segments")  # annotation layers that become columns in CSV/Parquet
TokenDecoder = Callable[[int], str]


# -- the annotations every format carries (computed in core/annotate/shown.py) -----------------------


def spike_flags(trace: Trace) -> list[bool]:
    """Per token: is it a spike under the trace's spike layer (all False without one)."""
    flags = [False] * len(trace)
    for p in trace.spike_positions:
        flags[p] = True
    return flags


def tag_column(trace: Trace) -> list[str]:
    """Per token: its planning category, "" for none (untagged / execution), as the app underlines them."""
    tags = trace.annotations.get("tags") or [""] * len(trace)
    return [str(t) if tag_colour(t) is not None else "" for t in tags]


def token_decoder(traces: Sequence[Trace]) -> TokenDecoder | None:
    """Token-id -> text through the tokenizer the traces record (local files only, no download, no remote
    code); None when it cannot be loaded or the traces come from different pairs."""
    bases = [(t.meta.get("pair") or {}).get("base") or {} for t in traces]  # one read of each trace
    ids = {str(base.get("id") or "") for base in bases}
    if len(ids) != 1 or not next(iter(ids)):
        return None
    model_id, revision = next(iter(ids)), bases[0].get("revision")
    try:
        decode_ids = _fast_decoder(model_id, revision) or _auto_decoder(model_id)
    except Exception as exc:  # noqa: BLE001 - any loading failure means "no token strings", never a crash
        log.info("no tokenizer for token strings in the export (%s); top-k shows ids as #id", exc)
        return None
    cache: dict[int, str] = {}

    def decode(i: int) -> str:
        if i not in cache:
            cache[i] = decode_ids([int(i)])
        return cache[i]

    return decode


def _fast_decoder(model_id: str, revision: str | None) -> Callable[[list[int]], str] | None:
    """The model's tokenizer.json through the `tokenizers` library alone: what AutoTokenizer's fast tokenizer
    decodes (no clean-up), without importing transformers and torch (a one-trace export starts in < 1 s)."""
    path = Path(model_id) / "tokenizer.json"
    if not Path(model_id).is_dir():
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model_id, "tokenizer.json", revision=revision)
        path = Path(found) if isinstance(found, str) else None
    if path is None or not path.is_file():
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    return lambda ids: tok.decode(ids, skip_special_tokens=False)


def _auto_decoder(model_id: str) -> Callable[[list[int]], str]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_id, local_files_only=True, trust_remote_code=False)
    return lambda ids: tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _topk_text(trace: Trace, side: str, decode: TokenDecoder | None) -> list[list[str]]:
    if not len(trace):
        return []
    ids = np.asarray(trace.topk[side][0])
    show = decode if decode is not None else (lambda i: f"#{i}")
    distinct, at = np.unique(ids, return_inverse=True)  # each distinct id shown once, then looked up
    return np.array([show(int(i)) for i in distinct.tolist()], dtype=object)[at.reshape(ids.shape)].tolist()


def _dumps(value: Any, indent: int | None = None) -> str:
    return dumps_strict(value, ensure_ascii=False, indent=indent)  # NaN/inf -> null (core/io/jsonsafe.py)


# -- JSONL: lossless -------------------------------------------------------------------------------


def _floats_out(values: np.ndarray) -> list[Any]:
    """Floats as a JSON-safe list: NaN/inf become null (strict JSON readers reject NaN)."""
    arr = np.asarray(values)
    if arr.dtype.kind != "f":
        return arr.tolist()
    return [v if np.isfinite(v) else None for v in arr.tolist()]


def _k(ids: Any) -> int:
    return int(np.shape(ids)[-1]) if np.ndim(ids) == 2 else 0


def trace_to_record(trace: Trace, decode: TokenDecoder | None = None) -> dict[str, Any]:
    """One trace as a JSON-ready dict (the JSONL line), with dtypes so that reading it back is exact.

    Besides the lossless arrays it carries what the user sees: per token `spike` (bool), `tag` ("" for
    none) and `rank_shift`, the top-k as token strings next to the ids and probabilities, and `annotations` (the spike
    rule and positions, tags, segments)."""
    metrics = {name: np.asarray(values) for name, values in trace.metrics.items()}
    return {
        "forkpoint_trace": JSONL_VERSION,
        "key": trace.key,
        "exported_by": {"forkpoint": forkpoint_version(), "at": utc_now()},
        "meta": trace.meta,
        "prompt_ids": trace.prompt_ids,
        "token_ids": trace.token_ids.tolist(),
        "tokens": list(trace.tokens),
        "source": [str(s) for s in trace.source],
        "metrics": {name: _floats_out(values) for name, values in metrics.items()},
        "topk": {
            side: {"ids": np.asarray(trace.topk[side][0]).tolist(), "probs": np.asarray(trace.topk[side][1]).tolist(),
                   "tokens": _topk_text(trace, side, decode)}
            for side in SIDES
        },
        "spike": spike_flags(trace),
        "tag": tag_column(trace),
        "rank_shift": [str(c) for c in rank_shift(trace)],  # unshifted / marginal / shifted (core/annotate/rank_shift.py)
        "dtypes": {
            "metrics": {name: str(values.dtype) for name, values in metrics.items()},
            "topk_probs": {side: str(np.asarray(trace.topk[side][1]).dtype) for side in SIDES},
            "k": {side: _k(trace.topk[side][0]) for side in SIDES},
        },
        "annotations": trace.annotations,
    }


def record_to_trace(record: dict[str, Any]) -> Trace:
    """Inverse of `trace_to_record`; raises InvalidInputError on a record it cannot read."""
    if not isinstance(record, dict) or "forkpoint_trace" not in record:
        raise InvalidInputError("not a forkpoint trace record (no 'forkpoint_trace' field)")
    version = record["forkpoint_trace"]
    if not isinstance(version, int) or version > JSONL_VERSION:
        raise InvalidInputError(f"trace record version {version!r} is newer than this forkpoint's {JSONL_VERSION}")
    dtypes = record.get("dtypes", {})
    n = len(record["token_ids"])
    metrics = {}
    for name, values in record["metrics"].items():
        dtype = np.dtype(dtypes.get("metrics", {}).get(name, "float64"))
        if dtype.kind == "f":
            metrics[name] = floats_in(values, dtype)
        else:
            metrics[name] = np.array(values, dtype=dtype)
    topk = {}
    for side in SIDES:
        k = int(dtypes.get("k", {}).get(side, 0))
        ids = np.array(record["topk"][side]["ids"], dtype=np.int64).reshape(n, -1 if n else k)
        probs_dtype = np.dtype(dtypes.get("topk_probs", {}).get(side, "float32"))
        probs = np.array(record["topk"][side]["probs"], dtype=probs_dtype).reshape(ids.shape)
        topk[side] = (ids, probs)
    return Trace(
        token_ids=np.array(record["token_ids"], dtype=np.int64),
        tokens=list(record["tokens"]),
        prompt_ids=record["prompt_ids"],
        metrics=metrics,
        topk=topk,
        source=np.array(record["source"], dtype=object),
        meta=record.get("meta") or {},
        annotations=record.get("annotations") or {},
    )


def read_jsonl(path: str | os.PathLike[str]) -> list[Trace]:
    """Traces from a forkpoint JSONL export; InvalidInputError naming the first bad line."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"No such file: {path}")
    traces = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                traces.append(record_to_trace(json.loads(raw)))
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise InvalidInputError(f"{path}, line {lineno}: {type(exc).__name__}: {exc}") from exc
    return traces


# -- CSV / Parquet: one row per token ---------------------------------------------------------------


def long_frame(traces: Sequence[Trace], decode: TokenDecoder | None = None) -> pd.DataFrame:
    """All traces, one row per token: trace_key, pos, token_id, token, metrics, source, spike (bool),
    tag ("" for none), segment, switch ("" or who a core.takeover switch made write there), and
    topk_{base,reason}_{tokens,probs,ids} as lists."""
    parts = [_long_columns(trace, decode) for trace in traces]
    names = list(parts[0]) if parts else []
    if parts and all(list(part) == names and len(part["pos"]) for part in parts):  # the usual case: one frame
        return pd.DataFrame({name: np.concatenate([part[name] for part in parts])
                             if isinstance(parts[0][name], np.ndarray)
                             else [x for part in parts for x in part[name]] for name in names})
    # traces with different layers (a segment or note column in some) or an empty one: pandas aligns one frame
    # per trace (missing values NaN)
    return pd.concat([pd.DataFrame(part) for part in parts], ignore_index=True) if parts else pd.DataFrame()


def _long_columns(trace: Trace, decode: TokenDecoder | None) -> dict[str, Any]:
    """One trace's columns of `long_frame`, in its order."""
    data = trace.columns()
    for name in [f"topk_{side}" for side in SIDES] + ["tag", "spike"]:
        data.pop(name, None)
    n = len(trace)
    data = {"trace_key": [trace.key] * n, **data, "spike": np.asarray(spike_flags(trace), dtype=bool),
            "tag": tag_column(trace)}
    data.setdefault("switch", [""] * n)  # the switches core.takeover made (column present for every trace)
    for side in SIDES:
        ids, probs = trace.topk[side]
        data[f"topk_{side}_tokens"] = _topk_text(trace, side, decode)
        data[f"topk_{side}_probs"] = np.asarray(probs, dtype=np.float64).tolist() if n else []
        data[f"topk_{side}_ids"] = np.asarray(ids).tolist() if n else []
    return data


def _record_header(traces: Sequence[Trace], fmt: str) -> dict[str, Any]:
    """The reproducibility record that travels with a tabular export (sidecar or Parquet metadata)."""
    return {
        "forkpoint_export": JSONL_VERSION,
        "format": fmt,
        "forkpoint_version": forkpoint_version(),
        "exported": utc_now(),
        "traces": [
            {
                "key": t.key,
                "meta": t.meta,
                "prompt_ids": t.prompt_ids,
                "annotations": {k: v for k, v in t.annotations.items() if k not in PER_TOKEN_LAYERS},
            }
            for t in traces
        ],
    }


# -- the export formats: one table read by core.export, the CLI's --format and the app's downloads --------


def _write_jsonl(traces: list[Trace], path: Path, score: str, decode: TokenDecoder | None) -> None:
    write_atomic(path, lambda fh: fh.writelines(_dumps(trace_to_record(t, decode)) + "\n" for t in traces))


def _write_html(traces: list[Trace], path: Path, score: str, decode: TokenDecoder | None) -> None:
    page = html_page(traces, score=score, decode=decode)
    write_atomic(path, lambda fh: fh.write(page))


def _write_csv(traces: list[Trace], path: Path, score: str, decode: TokenDecoder | None) -> None:
    frame = long_frame(traces, decode)
    for col in [c for c in frame.columns if c.startswith("topk_")]:
        frame[col] = [json.dumps(v, ensure_ascii=False) for v in frame[col]]
    header = _record_header(traces, "csv")
    write_csv(frame, path, what="export")  # the CSV first: a sidecar never describes a file that is not there
    try:
        write_atomic(sidecar_path(path), lambda fh: fh.write(_dumps(header, indent=1)))
    except BaseException:
        path.unlink(missing_ok=True)  # nor a CSV without its record: the failed export leaves neither
        sidecar_path(path).unlink(missing_ok=True)
        raise


def _write_parquet(traces: list[Trace], path: Path, score: str, decode: TokenDecoder | None) -> None:
    table = pa.Table.from_pandas(long_frame(traces, decode), preserve_index=False)
    metadata = {**(table.schema.metadata or {}), b"forkpoint": _dumps(_record_header(traces, "parquet")).encode("utf-8")}
    table = table.replace_schema_metadata(metadata)
    write_atomic(path, lambda fh: pq.write_table(table, fh), binary=True)


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """Where a CSV export keeps its reproducibility record: `<file>.meta.json`."""
    path = Path(path)
    return path.with_name(path.name + ".meta.json")


@dataclass(frozen=True)
class ExportFormat:
    """One export format: its writer `write(traces, path, score, decode)`, the file suffix, the file's MIME type,
    the files written beside it (`sidecars`: path -> path) and how the app names it."""

    name: str
    label: str
    suffix: str
    mime: str
    write: Callable[[list[Trace], Path, str, TokenDecoder | None], None]
    sidecars: tuple[Callable[[Path], Path], ...] = ()

    def paths(self, path: str | os.PathLike[str]) -> list[Path]:
        """Every file an export to `path` writes: the file, then its sidecars."""
        return [Path(path), *(side(Path(path)) for side in self.sidecars)]

    @property
    def download(self) -> tuple[str, str]:
        """(suffix, MIME type) of the one file a download hands over: a format with sidecars comes zipped."""
        return (".zip", "application/zip") if self.sidecars else (self.suffix, self.mime)


FORMATS: dict[str, ExportFormat] = {f.name: f for f in (
    ExportFormat("jsonl", "JSONL (lossless)", ".jsonl", "application/jsonl", _write_jsonl),
    ExportFormat("csv", "CSV (+ record, zipped)", ".csv", "text/csv", _write_csv, sidecars=(sidecar_path,)),
    ExportFormat("parquet", "Parquet", ".parquet", "application/vnd.apache.parquet", _write_parquet),
    ExportFormat("html", "HTML (self-contained)", ".html", "text/html", _write_html),
)}  # fmt: skip


# -- export entry point -------------------------------------------------------------------------------


def check_format(fmt: str) -> str:
    """Return `fmt` if it is a known export format, else raise with the valid choices."""
    if fmt not in FORMATS:
        raise InvalidInputError(f"Unknown export format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    return fmt


def export(
    traces: Trace | Iterable[Trace],
    path: str | os.PathLike[str],
    format: str | None = None,
    *,
    score: str = DEFAULT_SCORE,
    overwrite: bool = False,
    decode: TokenDecoder | None = None,
    top: float | None = None,
    gate: Any = None,
) -> Path:
    """Write traces to `path` in one of `FORMATS` (jsonl | csv | parquet | html; default: from the file suffix).

    Every format carries the annotations the app shows (see `annotated`: spikes under `top`/`gate`, else
    the trace's own or the top settings.SPIKE_TOP; planning tags) and the top-k as token strings (through
    `decode`, else the recorded tokenizer when it is on disk, else "#id"). Refuses to replace an existing
    file unless overwrite=True. CSV keeps its reproducibility record in `<file>.meta.json`; Parquet in its
    schema metadata; JSONL and HTML inline. Returns the path.
    """
    traces = [traces] if isinstance(traces, Trace) else list(traces)
    path = Path(path)
    if format is None and not path.suffix:
        raise InvalidInputError(f"Cannot tell the export format from {str(path)!r} (no suffix): name a "
                                f"{' / '.join(f.suffix for f in FORMATS.values())} file, or give format=")
    fmt = FORMATS[check_format(format if format is not None else path.suffix.lstrip(".").lower())]
    if not traces:
        raise InvalidInputError("No traces to export")
    check_score(score)
    targets = fmt.paths(path)
    existing = [str(p) for p in targets if p.exists()]
    if existing and not overwrite:
        raise OutputExistsError(f"{', '.join(existing)} already exists; overwrite=True (CLI: --overwrite) replaces it")
    created = make_folders(path.parent)
    try:
        _write_export(traces, path, fmt, targets, score, top, gate, decode)
    except BaseException:
        remove_empty(created)  # a failed export leaves no folder it made
        raise
    log.info("exported %d trace(s) to %s (%s)", len(traces), path, fmt.name)
    return path


def _write_export(traces: list[Trace], path: Path, fmt: ExportFormat, targets: list[Path], score: str,
                  top: float | None, gate: Any, decode: TokenDecoder | None) -> None:
    removed, _ = clean_temp_files(path.parent, [p.name for p in targets])  # a killed export's leftovers
    for tmp in removed:
        log.warning("removed %s, the temp file of an export that was killed", tmp)
    traces = [annotated(t, score, top, gate) for t in traces]
    if decode is None:
        decode = token_decoder(traces)
    fmt.write(traces, path, score, decode)
