"""SummaryIndex: the index file mirrored into a per-process SQLite scratch file answers exactly as the
in-memory dict it replaced (same lines believed, same bad_lines, same resets), and holds no per-entry state
in Python memory."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import sqlite3
import tracemalloc
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from core.io import summary_index as si
from core.io.summary_index import FIELDS, TAG, SummaryIndex, index_line, line_ok

FORK = multiprocessing.get_context("fork")


class DictIndex:
    """The dict-backed index this module used to be (a float64-style brute-force reference): the whole file's
    new bytes read at once, every believed line kept in a dict."""

    def __init__(self, path: Path) -> None:
        self.path, self.entries, self.bad_lines, self._offset, self._ino = path, {}, 0, 0, -1

    def refresh(self) -> None:
        try:
            st_ = self.path.stat()
        except FileNotFoundError:
            self.entries, self._offset = {}, 0
            return
        if st_.st_size < self._offset or st_.st_ino != self._ino:
            self.entries, self._offset, self._ino = {}, 0, st_.st_ino
        data = self.path.read_bytes()[self._offset: st_.st_size]
        end = data.rfind(b"\n") + 1
        for raw in data[:end].split(b"\n"):
            raw = raw.strip()
            if not raw:
                continue
            entry = json.loads(raw) if line_ok(raw) else None
            if (isinstance(entry, dict) and entry.get("f") == TAG and isinstance(entry.get("s"), list)
                    and len(entry["s"]) == len(FIELDS) and isinstance(entry.get("id"), list)):
                self.entries.setdefault(str(entry["key"]), {})[tuple(entry["id"])] = dict(zip(FIELDS, entry["s"]))
            else:
                self.bad_lines += 1
        self._offset += end

    def get(self, key: str, ident: tuple) -> dict | None:
        self.refresh()
        found = self.entries.get(key, {}).get(ident)
        return found if found is not None and found.get("key") == key else None

    def remember(self, key: str, ident: tuple, summary: dict) -> None:
        self.entries.setdefault(key, {})[ident] = summary


KEYS = ["a" * 32, "b" * 32, "c" * 32]
IDENTS = [(1, 10, 100), (1, 11, 100), (2, 10, 100)]


def summary(key: str, n: int, prompt: str = "") -> dict[str, Any]:
    return {"key": key, "n_tokens": n, "prompt": prompt, "correct": n % 2 == 0, "schema": 3}


op = st.one_of(
    st.tuples(st.just("line"), st.integers(0, 2), st.integers(0, 2), st.integers(0, 99), st.text(max_size=5)),
    st.tuples(st.just("garbage"), st.sampled_from([b"not json", b'{"key": 1}', b"[1, 2"])),
    st.tuples(st.just("torn"), st.integers(0, 2), st.integers(0, 2), st.integers(1, 40)),
    st.tuples(st.just("edited"), st.integers(0, 2), st.integers(0, 2)),
    st.tuples(st.just("wrong_key"), st.integers(0, 2), st.integers(0, 2)),
    st.tuples(st.just("remember"), st.integers(0, 2), st.integers(0, 2), st.integers(0, 99)),
    st.tuples(st.just("truncate")),
    st.tuples(st.just("replace")),
    st.tuples(st.just("delete")),
    st.tuples(st.just("read")),
)


def _apply(path: Path, step: tuple, indexes: list[Any]) -> None:
    kind = step[0]
    if kind in ("line", "torn", "edited", "wrong_key"):
        key, ident = KEYS[step[1]], IDENTS[step[2]]
        line = index_line(key, ident, summary(key if kind != "wrong_key" else KEYS[(step[1] + 1) % 3],
                                               step[3] if kind == "line" else 7, step[4] if kind == "line" else ""))
        if kind == "torn":
            line = line[: step[3]]  # a writer killed mid-line: no newline yet
        elif kind == "edited":
            line = line.replace(b"7", b"8", 1)  # a hand edit: the CRC no longer holds
        with open(path, "ab") as fh:
            fh.write(line)
    elif kind == "garbage":
        with open(path, "ab") as fh:
            fh.write(step[1] + b"\n")
    elif kind == "remember":
        for index in indexes:
            index.remember(KEYS[step[1]], IDENTS[step[2]], summary(KEYS[step[1]], step[3], "remembered"))
    elif kind == "truncate" and path.exists():
        os.truncate(path, path.stat().st_size // 2)
    elif kind == "replace" and path.exists():
        data = path.read_bytes()
        tmp = path.with_suffix(".new")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # a new inode (as repair() writes it)
    elif kind == "delete" and path.exists():
        path.unlink()


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=25))
def test_answers_exactly_as_the_dict_index(tmp_path_factory, steps):
    path = tmp_path_factory.mktemp("idx") / "index.jsonl"
    new, ref = SummaryIndex(path), DictIndex(path)
    for step in steps:
        _apply(path, step, [new, ref])
        for key in KEYS:
            for ident in IDENTS:
                assert new.get(key, ident) == ref.get(key, ident), (step, key, ident)
        assert new.bad_lines == ref.bad_lines
    new.refresh()
    ref.refresh()
    assert dict(new.entries) == {k: v for k, v in ref.entries.items() if v}


def _fill(path: Path, n: int, prompt_bytes: int = 1000) -> None:
    with open(path, "wb") as fh:
        for i in range(n):
            key = f"{i:032x}"
            fh.write(index_line(key, (i, 100, 1000), summary(key, i, "x" * prompt_bytes)))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1200), st.integers(0, 2)), max_size=1300))
def test_get_many_is_get_of_each(tmp_path_factory, asked):
    """`get_many` (the listing's lookup, a chunk of keys per query) answers each (key, identity) as `get` does:
    lines for keys 0-1099, a second version of every 7th key, asked for keys up to 1200 (absent ones), with the
    line's identity, the second version's or one never written; more than LOOKUP_CHUNK at a time."""
    path = tmp_path_factory.mktemp("idx") / "index.jsonl"
    _fill(path, 1100, prompt_bytes=5)
    with open(path, "ab") as fh:
        for i in range(0, 1100, 7):
            key = f"{i:032x}"
            fh.write(index_line(key, (i, 200, 2000), summary(key, i + 1, "y")))
    index = SummaryIndex(path)
    idents = [lambda i: (i, 100, 1000), lambda i: (i, 200, 2000), lambda i: (i, 300, 3000)]
    files = [(f"{i:032x}", idents[v](i)) for i, v in asked]
    assert index.get_many(files) == [index.get(key, ident) for key, ident in files]


def test_entries_are_not_held_in_python_memory(tmp_path):
    """20,000 lines of ~1.2 KB: the dict index held ~30 MB of Python objects; this one holds none per entry."""
    path = tmp_path / "index.jsonl"
    _fill(path, 20_000)
    gc.collect()
    tracemalloc.start()
    try:
        index = SummaryIndex(path)
        index.refresh()
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
        reference = DictIndex(path)
        reference.refresh()
        gc.collect()
        dict_held = tracemalloc.get_traced_memory()[0] - held
    finally:
        tracemalloc.stop()
    assert index.get(f"{123:032x}", (123, 100, 1000))["n_tokens"] == 123
    assert held < 1 << 20, held  # < 1 MiB, whatever the number of lines
    assert peak < 8 * si.READ_BYTES, peak  # one block of the file and its parse at a time (the file: 24 MB)
    assert dict_held > 20 * held  # the test can fail: the dict holds every entry


def _child(path: str, key: str, ident: tuple, out: Any) -> None:
    index = _PARENT[0]
    out.put((index.get(key, ident) is not None, index._cache().dir != _PARENT[1]))


_PARENT: list[Any] = []


def test_a_forked_child_rebuilds_its_own_cache_and_leaves_the_parents(tmp_path):
    path = tmp_path / "index.jsonl"
    _fill(path, 10, prompt_bytes=10)
    index = SummaryIndex(path)
    index.refresh()
    folder = index._cache().dir
    _PARENT[:] = [index, folder]
    queue = FORK.Queue()
    proc = FORK.Process(target=_child, args=(str(path), f"{3:032x}", (3, 100, 1000), queue))
    proc.start()
    found, own = queue.get(timeout=60)
    proc.join(60)
    assert found and own
    assert index.get(f"{3:032x}", (3, 100, 1000)) is not None  # the parent's file still answers
    _PARENT.clear()


def test_the_scratch_file_has_no_name_left_behind(tmp_path):
    """The SQLite file is unlinked once open: nothing to clean up, even after kill -9 (the space returns when the
    process ends); the index still answers from it."""
    path = tmp_path / "index.jsonl"
    _fill(path, 3, prompt_bytes=10)
    index = SummaryIndex(path)
    index.refresh()
    assert not Path(index._cache().dir).exists() and len(index.entries) == 3
    assert index.get(f"{2:032x}", (2, 100, 1000))["n_tokens"] == 2
    db = index._cache().db
    del index
    gc.collect()
    try:
        db.execute("SELECT 1")
        closed = False
    except sqlite3.ProgrammingError:  # closed with its index
        closed = True
    assert closed


def test_a_new_index_reads_in_blocks(tmp_path, monkeypatch):
    """Lines straddling the block boundary are read whole; a torn last line waits for its newline."""
    monkeypatch.setattr(si, "READ_BYTES", 100)  # smaller than one line
    path = tmp_path / "index.jsonl"
    _fill(path, 50, prompt_bytes=30)
    with open(path, "ab") as fh:
        fh.write(index_line("f" * 32, (9, 9, 9), summary("f" * 32, 1))[:-20])
    index = SummaryIndex(path)
    assert index.get(f"{49:032x}", (49, 100, 1000))["n_tokens"] == 49 and len(index.entries) == 50
    assert index.get("f" * 32, (9, 9, 9)) is None and index.bad_lines == 0
    with open(path, "ab") as fh:
        fh.write(index_line("f" * 32, (9, 9, 9), summary("f" * 32, 1))[-20:])
    assert index.get("f" * 32, (9, 9, 9))["n_tokens"] == 1 and index.bad_lines == 0


def test_no_room_for_the_scratch_file_keeps_the_index_in_memory(tmp_path, monkeypatch, caplog):
    """A temporary folder that is missing or read-only at the start, or fills up later: the index answers the same,
    from memory, and says why once."""
    path = tmp_path / "index.jsonl"
    _fill(path, 5, prompt_bytes=10)

    def no_room(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(si.tempfile, "mkstemp", no_room)
        index = SummaryIndex(path)
        assert index.get(f"{4:032x}", (4, 100, 1000))["n_tokens"] == 4 and len(index.entries) == 5
    assert "kept in memory" in caplog.text

    class FullDisk:
        """The scratch connection once its folder is full: every write fails, reads and backup still work."""

        def __init__(self, db: sqlite3.Connection) -> None:
            self.db = db

        def executemany(self, *args: Any) -> Any:
            raise sqlite3.OperationalError("database or disk is full")

        def __getattr__(self, name: str) -> Any:
            return getattr(self.db, name)

        def __enter__(self) -> Any:
            return self.db.__enter__()

        def __exit__(self, *exc: Any) -> Any:
            return self.db.__exit__(*exc)

    later = SummaryIndex(path)
    later.refresh()
    cache = later._cache()
    cache.db = FullDisk(cache.db)
    caplog.clear()
    later.remember("e" * 32, (7, 7, 7), summary("e" * 32, 3))  # a write: moves to memory and goes on
    assert isinstance(cache.db, sqlite3.Connection) and "kept in memory" in caplog.text
    assert later.get(f"{4:032x}", (4, 100, 1000))["n_tokens"] == 4  # what the file held came along
    assert later.get("e" * 32, (7, 7, 7))["n_tokens"] == 3
