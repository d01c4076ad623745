"""Export bytes for download buttons: core.export writes the file, this returns its bytes."""

from __future__ import annotations

import io
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from core.scoring.registry import DEFAULT_SCORE
from core.trace import Trace
from core.views.exports import FORMATS, export

EAGER_MAX = 50  # traces the Export page writes as soon as chosen; more wait for "Prepare" (5,600: 27-67 s a format)


def file_name(keys: Sequence[str], fmt: str) -> str:
    """forkpoint-<key8>.<ext> for one trace, forkpoint-<n>-traces.<ext> for several (a format with sidecars, CSV,
    comes zipped)."""
    stem = keys[0][:8] if len(keys) == 1 else f"{len(keys)}-traces"
    return f"forkpoint-{stem}{FORMATS[fmt].download[0]}"


def mime_type(fmt: str) -> str:
    """The MIME type of the file a download of `fmt` hands over (a zip for a format with sidecars)."""
    return FORMATS[fmt].download[1]


def export_file_bytes(traces: Sequence[Trace], fmt: str, score: str = DEFAULT_SCORE,
                      decode: Callable[[int], str] | None = None, top: float | None = None,
                      gate: Any = None) -> bytes:
    """The bytes of `core.views.exports.export(traces, ..., fmt)` with the app's spike rule (`top` or `gate`), so
    the file carries the spikes the user sees; a format with sidecars (CSV and its .meta.json record) as a zip."""
    spec = FORMATS[fmt]
    with tempfile.TemporaryDirectory() as tmp:
        out = export(list(traces), Path(tmp) / f"traces{spec.suffix}", fmt, score=score, decode=decode,
                     overwrite=True, top=top if gate is None else None, gate=gate)
        if not spec.sidecars:
            return out.read_bytes()
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for written in spec.paths(out):
                zf.write(written, written.name)
        return buf.getvalue()
