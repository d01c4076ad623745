"""Notes and bookmarks on tokens: an annotation layer kept beside the store's traces, never inside them.

Layout: `<store>/notes/<key>.json`, one small JSON file per annotated trace ({"forkpoint_notes": 1,
"key", "notes": [...]}). Each change is a read-modify-write under an exclusive lock on
`<store>/notes/.lock`, written through `write_atomic` (temp file, fsync, rename): a killed writer leaves
the old notes or the new ones, never a torn file, and the trace's own Parquet file is never rewritten.
A note covers tokens start..end (inclusive); a bookmark is a note flagged `bookmark` (its text may be
empty). `attach_notes` puts the notes on traces as the "notes" annotation layer, which every export carries.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import logging
import os
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from core.errors import InvalidInputError, StoreError, WriteError
from core.io.atomic import clean_temp_files, os_error_reason, write_atomic
from core.io.store import TraceStore
from core.io.tracefile import check_key
from core.settings import check_text
from core.trace import Trace
from core.trace import note_texts

log = logging.getLogger(__name__)

NOTES_DIR = "notes"
NOTES_VERSION = 1
LAYER = "notes"  # the annotation layer name on a Trace
MAX_TEXT = 20_000  # characters per note
NOTE_SEARCH_COLUMNS = ("key", "id", "start", "end", "bookmark", "text", "created", "problem")


@dataclass(frozen=True)
class Note:
    """A note on tokens start..end (inclusive) of one trace; `bookmark` marks it for quick return."""

    id: str
    start: int
    end: int
    text: str = ""
    bookmark: bool = False
    created: str = ""

    def covers(self, pos: int) -> bool:
        return self.start <= pos <= self.end

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Note:
        return cls(id=str(raw["id"]), start=int(raw["start"]), end=int(raw["end"]), text=str(raw.get("text", "")),
                   bookmark=bool(raw.get("bookmark", False)), created=str(raw.get("created", "")))


def _root(store: Any) -> Path:
    """The store folder of a TraceStore or a path."""
    return Path(getattr(store, "path", store))


def notes_path(store: Any, key: str) -> Path:
    """Where the notes of trace `key` live: `<store>/notes/<key>.json`."""
    return _root(store) / NOTES_DIR / f"{check_key(key)}.json"


def _trace_file(store: Any, key: str) -> Path:
    return _root(store) / "traces" / f"{check_key(key)}.parquet"


def read_notes(store: Any, key: str) -> list[Note]:
    """The notes of trace `key`, ordered by position ([] when it has none); StoreError for a damaged file."""
    path = notes_path(store, key)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StoreError(f"Cannot read the notes file {path}: {os_error_reason(exc)}") from exc
    try:
        record = json.loads(raw)
        version = record.get("forkpoint_notes") if isinstance(record, dict) else None
        notes = [Note.from_dict(n) for n in record.get("notes", [])] if version == NOTES_VERSION else None
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise StoreError(f"The notes file {path} is damaged: {' '.join(str(exc).split())[:200]}") from exc
    if notes is None:
        raise StoreError(f"The notes file {path} is damaged: not a forkpoint notes file (version {version!r}, "
                         f"this forkpoint reads {NOTES_VERSION})")
    return sorted(notes, key=lambda n: (n.start, n.end, n.created, n.id))


@contextmanager
def _locked(store: Any) -> Iterator[Path]:
    folder = _root(store) / NOTES_DIR
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise WriteError(f"Cannot create the notes folder {folder}: {os_error_reason(exc)}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        clean_temp_files(folder)  # temp files of killed writers (live ones are locked and kept)
        yield folder
    finally:
        os.close(fd)


def _write(store: Any, key: str, notes: list[Note]) -> None:
    path = notes_path(store, key)
    if not notes:
        path.unlink(missing_ok=True)
        return
    body = json.dumps({"forkpoint_notes": NOTES_VERSION, "key": key, "notes": [n.to_dict() for n in notes]},
                      ensure_ascii=False, indent=1)
    write_atomic(path, lambda fh: fh.write(body), what=f"notes of trace {key}")


def _n_tokens(store: Any, key: str, n_tokens: int | None) -> int:
    if n_tokens is not None:
        return int(n_tokens)
    if not _trace_file(store, key).exists():
        raise InvalidInputError(f"No trace with key {key!r} in {_root(store)}; notes attach to stored traces")

    return len(store.get(key) if hasattr(store, "get") else TraceStore(_root(store)).get(key))


def add_note(store: Any, key: str, start: int, end: int | None = None, text: str = "", *, bookmark: bool = False,
             n_tokens: int | None = None) -> Note:
    """Add a note on tokens start..end (inclusive; end defaults to start) of stored trace `key`.

    `n_tokens` (the trace's length) skips reading the trace to check the range. A note needs text
    unless it is a bookmark."""
    end = start if end is None else end
    n = _n_tokens(store, key, n_tokens)
    if isinstance(start, bool) or isinstance(end, bool) or not 0 <= int(start) <= int(end) < n:
        raise InvalidInputError(f"Note range {start}..{end} is not within the trace's tokens 0..{n - 1} "
                                "(start ≤ end)")
    text = str(text).strip()
    if not text and not bookmark:
        raise InvalidInputError("A note needs text, or mark it as a bookmark (bookmark=True in Python)")
    if len(text) > MAX_TEXT:
        raise InvalidInputError(f"A note holds at most {MAX_TEXT} characters; this one has {len(text)}")
    check_text(text, "the note's text")  # a lone surrogate or NUL would not survive the JSON file
    note = Note(id=uuid.uuid4().hex[:12], start=int(start), end=int(end), text=text, bookmark=bool(bookmark),
                created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
    with _locked(store):
        _write(store, key, [*read_notes(store, key), note])
    log.info("note %s added to trace %s at %d..%d", note.id, key, note.start, note.end)
    return note


def _find(notes: list[Note], note_id: str, key: str) -> int:
    for i, note in enumerate(notes):
        if note.id == note_id:
            return i
    raise InvalidInputError(f"Trace {key} has no note {note_id!r}; its notes: {', '.join(n.id for n in notes) or 'none'}")


def edit_note(store: Any, key: str, note_id: str, *, text: str | None = None, bookmark: bool | None = None) -> Note:
    """Change a note's text and/or bookmark flag; returns the new note."""
    with _locked(store):
        notes = read_notes(store, key)
        i = _find(notes, note_id, key)
        old = notes[i]
        new = Note(old.id, old.start, old.end, old.text if text is None else str(text).strip(),
                   old.bookmark if bookmark is None else bool(bookmark), old.created)
        if not new.text and not new.bookmark:
            raise InvalidInputError("A note needs text, or mark it as a bookmark (bookmark=True in Python)")
        check_text(new.text, "the note's text", max_chars=MAX_TEXT)
        notes[i] = new
        _write(store, key, notes)
    return new


def delete_note(store: Any, key: str, note_id: str) -> None:
    """Remove one note (the file goes when its last note does)."""
    with _locked(store):
        notes = read_notes(store, key)
        del notes[_find(notes, note_id, key)]
        _write(store, key, notes)


def noted_keys(store: Any) -> list[str]:
    """Keys of the traces that have notes, sorted."""
    folder = _root(store) / NOTES_DIR
    if not folder.is_dir():
        return []
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json")
                  and not p.name.startswith("."))


def all_notes(store: Any) -> tuple[dict[str, list[Note]], list[tuple[Path, str]]]:
    """Every trace's notes, and the notes files that could not be read ((path, reason) each)."""
    out: dict[str, list[Note]] = {}
    bad: list[tuple[Path, str]] = []
    for key in noted_keys(store):
        try:
            out[key] = read_notes(store, key)
        except (StoreError, InvalidInputError) as exc:
            bad.append((_root(store) / NOTES_DIR / f"{key}.json", str(exc)))
    return out, bad


def unreadable_notes(store: Any) -> list[tuple[Path, str]]:
    """(path, reason) for every notes file that cannot be read (for `verify` and `repair`); nothing is moved."""
    return sorted(all_notes(store)[1])


def search_notes(store: Any, query: str = "", *, bookmarks_only: bool = False,
                 problems: dict[str, str] | None = None) -> pd.DataFrame:
    """Notes whose text (or trace key, or the trace's problem from `problems` {key: id}) contains `query`
    (case-insensitive; "" = all), one row each (NOTE_SEARCH_COLUMNS), by key then position."""
    q = str(query).strip().lower()
    rows = []
    for key, notes in all_notes(store)[0].items():
        problem = (problems or {}).get(key, "")
        for note in notes:
            if bookmarks_only and not note.bookmark:
                continue
            if q and q not in note.text.lower() and q not in key.lower() and q not in str(problem).lower():
                continue
            rows.append({"key": key, **note.to_dict(), "problem": problem})
    return pd.DataFrame(rows, columns=list(NOTE_SEARCH_COLUMNS))


def attach_notes(store: Any, traces: Trace | Iterable[Trace], *, damaged: list[tuple[Path, str]] | None = None) -> Any:
    """The trace(s) with their stored notes as the "notes" annotation layer (list of note dicts); a trace
    without notes (or without a key) is returned unchanged. Token data is never touched.

    A damaged notes file never stops the others: its trace goes without notes, and (path, reason) is
    appended to `damaged` (logged as a warning when no list is given)."""
    single = isinstance(traces, Trace)
    out = []
    for trace in [traces] if single else list(traces):
        try:
            notes = read_notes(store, trace.key) if trace.key else []
        except (StoreError, InvalidInputError) as exc:
            notes = []
            path = _root(store) / NOTES_DIR / f"{trace.key}.json"
            if damaged is None:
                log.warning("notes of trace %s left out: %s", trace.key, exc)
            else:
                damaged.append((path, str(exc)))
        out.append(trace.annotate(**{LAYER: [n.to_dict() for n in notes]}) if notes else trace)
    return out[0] if single else out


def trace_notes(trace: Trace) -> list[Note]:
    """The notes carried by a trace's "notes" annotation layer."""
    return [Note.from_dict(n) for n in trace.annotations.get(LAYER) or []]


def note_column(trace: Trace) -> list[str]:
    """Per token, the text of the notes covering it joined with " | " ("" for none; "🔖" for an empty bookmark):
    the `note` column of CSV/Parquet exports."""
    return note_texts([n.to_dict() for n in trace_notes(trace)], len(trace))


def notes_html(trace: Trace) -> str:
    """The trace's notes as an escaped HTML list (for the HTML export and `_repr_html_`; "" when none)."""
    import html

    notes = trace_notes(trace)
    if not notes:
        return ""
    items = []
    for note in notes:
        where = f"token {note.start}" if note.start == note.end else f"tokens {note.start}–{note.end}"
        mark = "🔖 " if note.bookmark else ""
        text = html.escape("".join(trace.tokens[note.start : note.end + 1])[:80])
        items.append(f'<li data-note="{html.escape(note.id, quote=True)}" data-start="{note.start}" '
                     f'data-end="{note.end}">{mark}<b>{where}</b> <code>{text}</code>: {html.escape(note.text)}</li>')
    return f'<div class="fp-notes"><b>Notes</b><ul>{"".join(items)}</ul></div>'


def notes_stamp(store: Any, keys: Iterable[str]) -> str:
    """A cheap tag that changes whenever any of these traces' notes change (for caches keyed by it)."""
    parts = []
    for key in keys:
        try:
            st = notes_path(store, key).stat()
            parts.append(f"{key}:{st.st_mtime_ns}:{st.st_size}")
        except OSError:
            continue
    return ";".join(parts)
