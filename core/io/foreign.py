"""Reading foreign files of `{id, prompt, response[, answer]}` records (JSONL, CSV, Parquet), streamed.

Formats: JSONL (one object per line), CSV (a header row with at least id, prompt, response) and Parquet
(columns of the same names; `response` may be a list of token ids). Every record is handled on its
own: a bad one is reported with its line (row) number and the reason, and the rest are stored.

Limits are checked before parsing, in bounded memory: a line over `MAX_LINE_BYTES` is skipped while
being read (never held whole), and JSON nested deeper than `MAX_DEPTH` is refused before the parser
sees it. A UTF-8 byte-order mark is ignored; lines may end in LF, CRLF or a bare CR.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import InvalidInputError
from core.settings import check_text

log = logging.getLogger(__name__)

IMPORT_FORMATS = ("jsonl", "csv", "parquet")
MAX_LINE_BYTES = 8 * 1024 * 1024  # one record (line, CSV row or Parquet row) at most 8 MiB
MAX_DEPTH = 64  # JSON nesting ([ and {) allowed in one record
_CHUNK = 1 << 20
_EOL = re.compile(rb"\r\n|\r|\n")
_STRUCT = re.compile(rb'["\\\[\]{}]')
_BOM = b"\xef\xbb\xbf"
_FIELDS = ("id", "prompt", "response", "answer")


@dataclass(frozen=True)
class ForeignRecord:
    """One `{id, prompt, response[, answer]}` record; `answer` is the reference (gold) answer."""

    line: int
    id: str
    prompt: str
    response: str | list[int]
    answer: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# -- reading, in bounded memory ---------------------------------------------------------------------


def _lines(fh: io.BufferedIOBase, max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """(line number, bytes without terminator), or (line number, None) for a line over `max_bytes`
    (skipped as it streams by, never held). LF, CRLF and bare CR all end a line."""
    lineno, buf, too_long, pending_cr, first = 0, bytearray(), False, False, True
    while chunk := fh.read(_CHUNK):
        if first:
            chunk, first = chunk.removeprefix(_BOM), False
        if pending_cr and chunk[:1] == b"\n":  # a CRLF split across two reads
            chunk = chunk[1:]
        pending_cr = False
        start = 0
        for m in _EOL.finditer(chunk):
            piece = chunk[start : m.start()]
            lineno += 1
            if too_long or len(buf) + len(piece) > max_bytes:
                yield lineno, None
            else:
                buf += piece
                yield lineno, bytes(buf)
            buf.clear()
            too_long = False
            start = m.end()
            pending_cr = m.group() == b"\r" and start == len(chunk)
        rest = chunk[start:]
        if not too_long and len(buf) + len(rest) > max_bytes:
            too_long = True
            buf.clear()
        elif not too_long:
            buf += rest
    if buf or too_long:
        yield lineno + 1, None if too_long else bytes(buf)


def json_depth_exceeds(raw: bytes | str, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON text nests arrays/objects deeper than `limit` (brackets inside strings don't count).

    Checked before parsing: Python's parser would hit its recursion limit on deep input."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if raw.count(b"[") + raw.count(b"{") <= limit:  # cannot be deeper than the number of openers
        return False
    depth, in_string, skip = 0, False, -1
    for m in _STRUCT.finditer(raw):
        i = m.start()
        if i < skip:
            continue
        c = raw[i]
        if in_string:
            if c == 0x5C:  # backslash: the next byte is escaped
                skip = i + 2
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif c in (0x5D, 0x7D):
            depth -= 1
    return False


def _no_constants(name: str) -> Any:
    raise InvalidInputError(f"non-standard JSON constant {name} (JSON has no NaN or Infinity)")


def _check_fields(obj: dict[str, Any], from_bytes: bool) -> None:
    """Every text field through `settings.check_text` (lone surrogates, NUL, size), named by field; nested
    extra fields must encode as UTF-8 JSON (they are stored in the trace's meta)."""
    for name, value in obj.items():
        if isinstance(value, str):
            check_text(value, f"field {name!r}", from_bytes=from_bytes)
        elif isinstance(value, (dict, list)):
            try:
                json.dumps(value, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidInputError(f"field {name!r} holds a lone surrogate (e.g. \\ud800), which is not "
                                        "valid Unicode text") from None
            except (TypeError, ValueError):
                continue


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _parse_foreign(obj: Any, from_bytes: bool = False) -> tuple[str, str, str | list[int], str | None, dict[str, Any]]:
    if not isinstance(obj, dict):
        raise InvalidInputError(f"expected a JSON object, got {type(obj).__name__}")
    _check_fields(obj, from_bytes)
    if "id" not in obj or isinstance(obj["id"], bool) or not isinstance(obj["id"], (str, int)) or obj["id"] == "":
        raise InvalidInputError("missing or invalid 'id' (a non-empty string or an integer)")
    prompt = obj.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise InvalidInputError(f"'prompt' must be a string, got {_kind(prompt)} {prompt!r:.40}")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidInputError("missing or empty 'prompt' (a string)")
    response = obj.get("response")
    if isinstance(response, list):
        if not response or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in response):
            raise InvalidInputError("'response' as a list must hold non-negative integer token ids")
    elif response is not None and not isinstance(response, str):
        raise InvalidInputError(f"'response' must be a string or a list of token ids, got {_kind(response)} "
                                f"{response!r:.40}")
    elif not response:
        raise InvalidInputError("missing or empty 'response' (a string or a list of token ids)")
    answer = obj.get("answer")
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (str, int, float))):
        raise InvalidInputError("'answer' must be a string or a number")
    extra = {k: v for k, v in obj.items() if k not in _FIELDS}
    return str(obj["id"]), prompt, response, None if answer is None else str(answer), extra


def _record(line: int, obj: Any, from_bytes: bool = False) -> ForeignRecord:
    rid, prompt, response, answer, extra = _parse_foreign(obj, from_bytes)
    return ForeignRecord(line, rid, prompt, response, answer, extra)
def _jsonl_records(path: Path, max_bytes: int) -> Iterator[ForeignRecord | tuple[int, str]]:
    with open(path, "rb") as fh:
        for lineno, raw in _lines(fh, max_bytes):
            if raw is None:
                yield lineno, f"line is longer than {max_bytes} bytes (the limit); skipped unread"
                continue
            if not raw.strip():
                continue
            if json_depth_exceeds(raw):
                yield lineno, f"JSON nested deeper than {MAX_DEPTH} levels (the limit)"
                continue
            try:
                obj = json.loads(raw.decode("utf-8"), parse_constant=_no_constants)
            except UnicodeDecodeError as exc:
                yield lineno, f"not UTF-8 text: {exc}"
                continue
            except (ValueError, RecursionError) as exc:
                yield lineno, f"not valid JSON: {exc}"
                continue
            try:
                yield _record(lineno, obj)
            except ValueError as exc:
                yield lineno, str(exc)


_CSV_STOP = re.compile(r"[,\r\n]")  # in an unquoted field: a delimiter or a line end


@dataclass(frozen=True)
class _CsvText:
    """One CSV record's text (None: over the size limit, skipped unread) and the lines it spans."""

    first: int
    last: int
    text: str | None
    open_quote: bool = False  # the file ended inside a quoted field
    text_after_quote: bool = False  # a closing quote followed by more text (`"a"b`): quotes out of step


def _csv_texts(fh: io.TextIOBase, max_bytes: int) -> Iterator[_CsvText]:
    """Split a CSV text stream into records in bounded memory, as the csv module's default dialect does:
    a record ends at a line end outside quotes; `""` inside quotes is a quote; a quote inside an
    unquoted field is a plain character. A record over `max_bytes` streams by without being held."""
    state, buf, size, too_long, stray = "start", [], 0, False, False
    line, first, pending_cr, ended = 0, 1, False, True
    while piece := fh.readline(_CHUNK):  # readline returns at most one line end, at the piece's end
        if pending_cr and piece == "\n":  # a CRLF that readline's size limit split: one line end
            pending_cr = False
            if state == "quoted" and not too_long:  # inside a quoted cell the \n is text
                size += 1
                buf.append(piece)
            continue  # else it ends the record the \r ended
        pending_cr = piece[-1] == "\r"
        ended = piece[-1] in "\r\n"
        i, n, record_ends = 0, len(piece), False
        while i < n and not record_ends:
            if state == "start":  # a field begins: a quote here opens a quoted field
                state, i = ("quoted", i + 1) if piece[i] == '"' else ("field", i)
            elif state == "field":
                m = _CSV_STOP.search(piece, i)
                if m is None:
                    i = n
                elif m.group() == ",":
                    state, i = "start", m.end()
                else:
                    record_ends = True
            elif state == "quoted":
                j = piece.find('"', i)
                state, i = ("quoted", n) if j < 0 else ("after_quote", j + 1)
            else:  # a quote inside a quoted field: "" is a quote, anything else ends the quoting
                stray = stray or piece[i] not in ",\r\n\""
                state, i = ("quoted", i + 1) if piece[i] == '"' else ("field", i)
        line += ended
        if not too_long:
            size += len(piece.encode("utf-8", "surrogateescape"))
            too_long = size > max_bytes
            if too_long:
                buf = []
            else:
                buf.append(piece)
        if record_ends:
            yield _CsvText(first, line, None if too_long else "".join(buf), text_after_quote=stray)
            state, buf, size, too_long, stray, first = "start", [], 0, False, False, line + 1
    if buf or too_long:
        last = line if ended else line + 1
        yield _CsvText(first, last, None if too_long else "".join(buf), state == "quoted", stray)


def _csv_cells(text: str) -> list[str]:
    return next(csv.reader([text]), [])


@dataclass(frozen=True)
class CsvRow:
    """One CSV record: its cells, or (cells None) why it cannot be read as one row; the lines it spans."""

    first: int
    last: int
    cells: list[str] | None
    problem: str = ""


def csv_rows(fh: io.TextIOBase, where: str, max_bytes: int = MAX_LINE_BYTES, skipped: bool = True
             ) -> Iterator[CsvRow]:
    """The records of a CSV text stream (opened with newline=""), header first, blank rows left out. A record
    that cannot be one row is a CsvRow with `problem` instead of cells: over `max_bytes`, a quote never closed,
    or quotes out of step that merged lines (`skipped`: the reader skips such rows, and the problem says so).
    A header that cannot be read raises InvalidInputError naming `where`. The one CSV splitter of foreign
    files and problem files."""
    csv.field_size_limit(max(max_bytes, csv.field_size_limit()))
    records = _csv_texts(fh, max_bytes)
    head = next(records, None)
    if head is None:
        return
    if head.text is None or head.open_quote:
        why = "is longer than the size limit" if head.text is None else "opens a quote that is never closed"
        raise InvalidInputError(f"{where}: the CSV header row {why}")
    yield CsvRow(head.first, head.last, _csv_cells(head.text))
    and_skipped = " and skipped" if skipped else ""
    for rec in records:
        span = f"lines {rec.first}-{rec.last}" if rec.last > rec.first else f"line {rec.first}"
        if rec.text is None:
            problem = f"row ({span}) is longer than {max_bytes} bytes (the limit)" + ("; skipped unread" if skipped else "")
        elif rec.open_quote:
            problem = (f"a quote opened on line {rec.first} is never closed: {span} were read as one "
                       f"row{and_skipped} (close the quote)")
        elif rec.text_after_quote and rec.last > rec.first:  # a quote left open swallowed the lines after it
            problem = (f"quotes out of step: a quote on line {rec.first} closes on line {rec.last} before more "
                       f"text, so {span} were read as one row{and_skipped} (check the quotes on line {rec.first})")
        else:
            cells = _csv_cells(rec.text)
            if any(cell.strip() for cell in cells):
                yield CsvRow(rec.first, rec.last, cells)
            continue
        yield CsvRow(rec.first, rec.last, None, problem)


def _csv_records(path: Path, max_bytes: int) -> Iterator[ForeignRecord | tuple[int, str]]:
    # surrogateescape: bytes that are not UTF-8 become lone surrogates, which _parse_foreign reports
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as fh:
        rows = csv_rows(fh, str(path), max_bytes)
        head = next(rows, None)
        if head is None:
            return
        header = head.cells
        for name in header:
            check_text(name, f"{path}: the CSV header", from_bytes=True)
        missing = [name for name in ("id", "prompt", "response") if name not in header]
        if missing:
            raise InvalidInputError(f"{path}: the CSV header lacks {', '.join(missing)} (has: {', '.join(header)})")
        for rec in rows:
            if rec.cells is None:
                yield rec.first, rec.problem
                continue
            if len(rec.cells) != len(header):
                hint = f" (the row runs over lines {rec.first}-{rec.last}: is a quote left open on line " \
                       f"{rec.first}?)" if rec.last > rec.first else ""
                yield rec.first, f"row has {len(rec.cells)} cells, the header has {len(header)}{hint}"
                continue
            obj: dict[str, Any] = dict(zip(header, rec.cells))
            if obj.get("answer") == "":
                obj["answer"] = None
            try:
                yield _record(rec.first, obj, from_bytes=True)  # read with surrogateescape: bytes, not surrogates
            except ValueError as exc:
                yield rec.first, str(exc)


def _parquet_records(path: Path, max_bytes: int) -> Iterator[ForeignRecord | tuple[int, str]]:
    """Row group by row group: a damaged group is reported row by row (with its row range), the rest read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise InvalidInputError(f"{path} is not a readable Parquet file: {exc}") from exc
    with pf:
        names = pf.schema_arrow.names
        missing = [name for name in ("id", "prompt", "response") if name not in names]
        if missing:
            raise InvalidInputError(f"{path}: the Parquet file lacks column(s) {', '.join(missing)}")
        row = 0
        for group in range(pf.num_row_groups):
            first, end = row + 1, row + pf.metadata.row_group(group).num_rows
            try:
                for batch in pf.iter_batches(batch_size=64, row_groups=[group]):
                    for obj in batch.to_pylist():
                        row += 1
                        size = sum(len(v) for v in obj.values() if isinstance(v, (str, list)))
                        if size > max_bytes:
                            yield row, f"row is larger than {max_bytes} bytes (the limit)"
                            continue
                        try:
                            yield _record(row, obj)
                        except ValueError as exc:
                            yield row, str(exc)
            except (OSError, pa.ArrowException) as exc:
                why = " ".join(str(exc).split())
                for lost in range(row + 1, end + 1):
                    yield lost, (f"row group {group + 1} of {pf.num_row_groups} (rows {first}-{end}) cannot be "
                                 f"read: {why}; the other row groups were read")
            row = end


def detect_format(path: str | os.PathLike[str], format: str | None = None) -> str:
    """The import format: `format` if given, else from the suffix (.jsonl/.json/.ndjson, .csv, .parquet).

    An existing path must be a regular file (a device such as /dev/zero or a FIFO would be read forever),
    and a Parquet file is never read as text."""
    if format is None:
        suffix = Path(path).suffix.lower().lstrip(".")
        format = {"json": "jsonl", "ndjson": "jsonl", "pq": "parquet"}.get(suffix, suffix)
    if format not in IMPORT_FORMATS:
        raise InvalidInputError(f"Unknown import format {format!r}; choose one of: {', '.join(IMPORT_FORMATS)}")
    path = Path(path)
    if path.exists() and not path.is_file():
        raise InvalidInputError(f"{path} is not a regular file (a folder, a device or a pipe): give a JSONL, CSV "
                                "or Parquet file")
    if format != "parquet" and path.is_file():
        if _is_parquet(path):
            raise InvalidInputError(f"{path} is a Parquet file (it starts and ends with PAR1), not {format}: import "
                                    "it as parquet")
    return format


def _is_parquet(path: Path) -> bool:
    """Parquet's framing: PAR1 at both ends of at least 12 bytes (a text line that happens to start with PAR1 is text)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
            if head != b"PAR1" or fh.seek(0, os.SEEK_END) < 12:
                return False
            fh.seek(-4, os.SEEK_END)
            return fh.read(4) == b"PAR1"
    except OSError:
        return False  # the reader says why it cannot open it


def iter_foreign(path: str | os.PathLike[str], format: str | None = None,
                 max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[ForeignRecord | tuple[int, str]]:
    """Stream a foreign file: a ForeignRecord per good record, (line, reason) per bad one, in file order."""
    path = Path(path)
    fmt = detect_format(path, format)
    if not path.exists():
        raise InvalidInputError(f"No such file: {path}")
    readers = {"jsonl": _jsonl_records, "csv": _csv_records, "parquet": _parquet_records}
    return readers[fmt](path, max_line_bytes)


def read_foreign_jsonl(path: str | os.PathLike[str], format: str | None = None
                       ) -> tuple[list[ForeignRecord], list[tuple[int, str]]]:
    """All records of a foreign file: (good records, [(line number, reason)] for the bad ones)."""
    records: list[ForeignRecord] = []
    errors: list[tuple[int, str]] = []
    for item in iter_foreign(path, format):
        if isinstance(item, ForeignRecord):
            records.append(item)
        else:
            errors.append(item)
    return records, errors


def count_records(path: str | os.PathLike[str], format: str | None = None) -> int:
    """How many lines (JSONL, CSV) or rows (Parquet) a progress bar should expect; cheap, bounded memory."""
    fmt = detect_format(path, format)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_metadata(path).num_rows
        except Exception:  # an unreadable file is reported by the reader itself
            return 0
    n, last = 0, b"\n"
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            n += chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
            last = chunk[-1:]
    n += last not in (b"\n", b"\r")
    return max(0, n - 1) if fmt == "csv" else n
