"""Files others open: JSONL (lossless), CSV and Parquet (one row per token), self-contained HTML;
and the import of foreign `{id, prompt, response[, answer]}` JSONL files.

Every export carries the reproducibility record (each trace's meta plus the exporting forkpoint's
version). All model text that reaches HTML goes through `core.heatmap` or `html.escape`.
"""

from __future__ import annotations

import html
import importlib.metadata
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from core.metrics import DEFAULT_SCORE, check_score
from core.errors import InvalidInputError
from core.heatmap import heatmap_css, legend_html, tokens_html
from core.io.atomic import write_atomic
from core.trace import SIDES, Trace, _json_default

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "csv", "parquet", "html")
JSONL_VERSION = 1  # the `forkpoint_trace` field of each JSONL line
PER_TOKEN_LAYERS = ("tags", "segments")  # annotation layers that become columns in CSV/Parquet


def forkpoint_version() -> str:
    """The installed forkpoint version, or "0+unknown" when running from a bare checkout."""
    try:
        return importlib.metadata.version("forkpoint")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _dumps(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, default=_json_default, ensure_ascii=False, indent=indent)


# -- JSONL: lossless -------------------------------------------------------------------------------


def _floats_out(values: np.ndarray) -> list[Any]:
    """Floats as a JSON-safe list: NaN/inf become null (strict JSON readers reject NaN)."""
    arr = np.asarray(values)
    if arr.dtype.kind != "f":
        return arr.tolist()
    return [v if np.isfinite(v) else None for v in arr.tolist()]


def _k(ids: Any) -> int:
    return int(np.shape(ids)[-1]) if np.ndim(ids) == 2 else 0


def trace_to_record(trace: Trace) -> dict[str, Any]:
    """One trace as a JSON-ready dict (the JSONL line), with dtypes so that reading it back is exact."""
    metrics = {name: np.asarray(values) for name, values in trace.metrics.items()}
    return {
        "forkpoint_trace": JSONL_VERSION,
        "key": trace.key,
        "exported_by": {"forkpoint": forkpoint_version(), "at": _now()},
        "meta": trace.meta,
        "prompt_ids": trace.prompt_ids,
        "token_ids": trace.token_ids.tolist(),
        "tokens": list(trace.tokens),
        "source": [str(s) for s in trace.source],
        "metrics": {name: _floats_out(values) for name, values in metrics.items()},
        "topk": {
            side: {"ids": np.asarray(trace.topk[side][0]).tolist(), "probs": np.asarray(trace.topk[side][1]).tolist()}
            for side in SIDES
        },
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
            metrics[name] = np.array([np.nan if v is None else v for v in values], dtype=dtype)
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


def long_frame(traces: Sequence[Trace]) -> pd.DataFrame:
    """All traces, one row per token: trace_key, pos, token_id, token, metrics, source, annotations,
    and topk_{base,reason}_{ids,probs} as lists."""
    frames = []
    for trace in traces:
        frame = trace.frame().drop(columns=[f"topk_{side}" for side in SIDES])
        frame.insert(0, "trace_key", trace.key)
        for side in SIDES:
            ids, probs = trace.topk[side]
            frame[f"topk_{side}_ids"] = np.asarray(ids).tolist() if len(trace) else []
            frame[f"topk_{side}_probs"] = np.asarray(probs, dtype=np.float64).tolist() if len(trace) else []
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _record_header(traces: Sequence[Trace], fmt: str) -> dict[str, Any]:
    """The reproducibility record that travels with a tabular export (sidecar or Parquet metadata)."""
    return {
        "forkpoint_export": JSONL_VERSION,
        "format": fmt,
        "forkpoint_version": forkpoint_version(),
        "exported": _now(),
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


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """Where a CSV export keeps its reproducibility record: `<file>.meta.json`."""
    path = Path(path)
    return path.with_name(path.name + ".meta.json")


# -- HTML -------------------------------------------------------------------------------------------

_PAGE_CSS = """
body { font: 14px system-ui, sans-serif; margin: 24px auto; max-width: 1100px; padding: 0 16px; color: #111; }
header h1 { margin: 0 0 4px; font-size: 22px; }
.muted { color: #6b7280; }
section.trace { border-top: 1px solid #e5e7eb; margin-top: 24px; padding-top: 12px; }
table.settings { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
table.settings td { border: 1px solid #e5e7eb; padding: 2px 8px; vertical-align: top; }
table.settings td:first-child { color: #6b7280; white-space: nowrap; }
pre.prompt, pre.record { white-space: pre-wrap; background: #f9fafb; padding: 8px; font-size: 12px; }
#fp-tip { position: fixed; display: none; z-index: 10000; max-width: 640px; white-space: pre; pointer-events: none;
  background: #111827; color: #f9fafb; font: 12px/1.35 ui-monospace, monospace; padding: 6px 8px; border-radius: 4px; }
#fp-tip.pinned { pointer-events: auto; outline: 2px solid #2563eb; }
"""

# Tooltips: the tip text is set with textContent, so nothing in it is ever parsed as HTML.
_PAGE_JS = """
(function () {
  var tip = document.getElementById("fp-tip"), pinned = null;
  function show(el, x, y) {
    tip.textContent = el.getAttribute("data-tip");
    tip.style.display = "block";
    var w = tip.offsetWidth, h = tip.offsetHeight;
    tip.style.left = Math.max(4, Math.min(x + 12, window.innerWidth - w - 8)) + "px";
    tip.style.top = (y + h + 24 > window.innerHeight ? Math.max(4, y - h - 12) : y + 16) + "px";
  }
  document.addEventListener("mouseover", function (e) {
    var el = e.target.closest && e.target.closest(".tok[data-tip]");
    if (el && !pinned) show(el, e.clientX, e.clientY);
  });
  document.addEventListener("mouseout", function (e) {
    var el = e.target.closest && e.target.closest(".tok[data-tip]");
    if (el && !pinned) tip.style.display = "none";
  });
  document.addEventListener("click", function (e) {
    var el = e.target.closest && e.target.closest(".tok[data-tip]");
    if (pinned) { pinned.classList.remove("sel"); tip.classList.remove("pinned"); }
    if (el && el !== pinned) {
      pinned = el; el.classList.add("sel"); tip.classList.add("pinned"); show(el, e.clientX, e.clientY);
    } else { pinned = null; tip.style.display = "none"; }
  });
})();
"""


def _model_text(side: Any) -> str:
    if not isinstance(side, dict):
        return str(side) if side is not None else "?"
    text = str(side.get("id") or "?")
    if side.get("revision"):
        text += f" @ {side['revision']}"
    if side.get("gguf_file"):
        text += f" ({side['gguf_file']})"
    return text


def settings_rows(trace: Trace) -> list[tuple[str, str]]:
    """(label, value) rows of a trace's reproducibility record, as plain (unescaped) text."""
    meta = trace.meta
    pair = meta.get("pair") or {}
    formats = meta.get("formats") or {}
    policy = meta.get("policy") or {}
    sampling = meta.get("sampling") or {}
    problem = meta.get("problem") or {}
    n = len(trace)
    takeovers = int(np.sum(np.asarray(trace.source, dtype=object) != "base")) if n else 0
    spikes = trace.annotations.get("spikes")
    rows = [
        ("key", str(trace.key)),
        ("kind", str(meta.get("kind"))),
        ("parent", f"{meta.get('parent')} at token {meta.get('branch_pos')}" if meta.get("parent") else "none"),
        ("problem", f"{problem.get('id')} (gold: {problem.get('gold')})"),
        ("base model", _model_text(pair.get("base"))),
        ("reasoning model", _model_text(pair.get("reason"))),
        ("dtype / device", f"{pair.get('dtype')} / {pair.get('device')}"),
        ("base prompt format", str(formats.get("base"))),
        ("reasoning prompt format", str(formats.get("reason"))),
        ("policy", f"{policy.get('name')} {_dumps(policy.get('params') or {})}"),
        ("sampling", ", ".join(f"{k}={v}" for k, v in sampling.items()) or "none"),
        ("seed", str(sampling.get("seed"))),
        ("answer / correct", f"{meta.get('answer')} / {meta.get('correct')}"),
        ("tokens / takeovers", f"{n} / {takeovers} (ρ = {takeovers / n if n else 0:.3f})"),
        ("spike rule", _dumps(spikes.get("rule")) if isinstance(spikes, dict) else "none"),
        ("created", str(meta.get("created"))),
        ("versions", _dumps(meta.get("versions") or {})),
        ("schema", str(meta.get("schema"))),
    ]
    return rows


def html_page(
    traces: Sequence[Trace],
    score: str = DEFAULT_SCORE,
    decode: Callable[[int], str] | None = None,
    title: str = "forkpoint export",
    scale: str = "linear",
) -> str:
    """A self-contained HTML page (inline CSS/JS, no external resources) with each trace's heatmap."""
    check_score(score)
    esc = html.escape
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{_PAGE_CSS}{heatmap_css()}</style></head><body>",
        f"<header><h1>{esc(title)}</h1><p class='muted'>{len(traces)} trace(s) · colour: {esc(score)} ({esc(scale)})"
        f" · exported {esc(_now())} by forkpoint {esc(forkpoint_version())}"
        " · hover a token for both models' top-k; click to pin</p></header>",
    ]
    for trace in traces:
        problem = trace.meta.get("problem") or {}
        rows = "".join(f"<tr><td>{esc(label)}</td><td>{esc(value)}</td></tr>" for label, value in settings_rows(trace))
        parts += [
            f'<section class="trace" data-key="{esc(str(trace.key), quote=True)}">',
            f"<h2>{esc(str(problem.get('id', 'trace')))} <span class='muted'>{esc(str(trace.key))}</span></h2>",
            f'<table class="settings">{rows}</table>',
            "<details><summary>prompt</summary>"
            f"<pre class='prompt'>{esc(str(problem.get('prompt', '')))}</pre></details>",
            legend_html(trace.annotations.get("tags"), score=score, scale=scale),
            tokens_html(trace, score=score, decode=decode, scale=scale, css_tips=False),
            "<details><summary>full reproducibility record (JSON)</summary>"
            f"<pre class='record'>{esc(_dumps(trace.meta, indent=1))}</pre></details>",
            "</section>",
        ]
    parts.append(f'<div id="fp-tip"></div><script>{_PAGE_JS}</script></body></html>')
    return "".join(parts)


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
    decode: Callable[[int], str] | None = None,
) -> Path:
    """Write traces to `path` as jsonl | csv | parquet | html (default: from the file suffix).

    Refuses to replace an existing file unless overwrite=True. CSV keeps its reproducibility record in
    `<file>.meta.json`; Parquet in its schema metadata; JSONL and HTML inline. Returns the path.
    """
    traces = [traces] if isinstance(traces, Trace) else list(traces)
    path = Path(path)
    fmt = check_format(format if format is not None else path.suffix.lstrip(".").lower())
    if not traces:
        raise InvalidInputError("No traces to export")
    if fmt == "html":
        check_score(score)
    targets = [path, sidecar_path(path)] if fmt == "csv" else [path]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not overwrite:
        raise InvalidInputError(f"{', '.join(existing)} already exists; pass overwrite=True to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        write_atomic(path, lambda fh: fh.writelines(_dumps(trace_to_record(t)) + "\n" for t in traces))
    elif fmt == "html":
        page = html_page(traces, score=score, decode=decode)
        write_atomic(path, lambda fh: fh.write(page))
    else:
        frame = long_frame(traces)
        header = _record_header(traces, fmt)
        if fmt == "csv":
            for col in [c for c in frame.columns if c.startswith("topk_")]:
                frame[col] = [json.dumps(v) for v in frame[col]]
            write_atomic(sidecar_path(path), lambda fh: fh.write(_dumps(header, indent=1)))
            write_atomic(path, lambda fh: frame.to_csv(fh, index=False))
        else:
            table = pa.Table.from_pandas(frame, preserve_index=False)
            metadata = {**(table.schema.metadata or {}), b"forkpoint": _dumps(header).encode("utf-8")}
            table = table.replace_schema_metadata(metadata)
            write_atomic(path, lambda fh: pq.write_table(table, fh), binary=True)
    log.info("exported %d trace(s) to %s (%s)", len(traces), path, fmt)
    return path
